"""labkit.engine.inside.copyruns / copyplan: a bucket's copies merged into strided ones land exactly what one copy per
tensor lands, on MoE-like stacks (fused gate/up and down per expert), padded (strided) destinations, dense
fused row blocks and random layouts; and the MoE layout really collapses to a few copies."""

import random

import pytest
import torch
from torch import nn

from labkit.engine.inside import copyplan
from labkit.engine.inside import copyruns
from tests.unit.test_apply import _bucket as packed  # (layout key, flat bucket) of named tensors


class Experts(nn.Module):
    """One MoE layer as SGLang's FusedMoE holds it (w13 [E, 2Ip, H], w2 [E, H, Ip]; Ip >= I: CPU padding) plus a
    dense qkv block and a norm; `param_view` as labkit's models answer it."""

    def __init__(self, experts: int, inter: int, hidden: int, pad: int = 0, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.i, self.ip = inter, inter + pad
        kw = dict(dtype=dtype, device=device)
        self.w13 = nn.Parameter(torch.zeros(experts, 2 * self.ip, hidden, **kw), requires_grad=False)
        self.w2 = nn.Parameter(torch.zeros(experts, hidden, self.ip, **kw), requires_grad=False)
        self.qkv = nn.Parameter(torch.zeros(12, hidden, **kw), requires_grad=False)
        self.norm = nn.Parameter(torch.zeros(hidden, **kw), requires_grad=False)

    def param_view(self, name: str):
        kind, _, idx = name.partition(".")
        if kind in ("gate", "up"):
            return "w13", self.w13.data[int(idx)].narrow(0, 0 if kind == "gate" else self.ip, self.i)
        if kind == "down":
            return "w2", self.w2.data[int(idx)].narrow(1, 0, self.i)
        if kind in ("q", "k", "v"):
            return "qkv", self.qkv.data.narrow(0, {"q": 0, "k": 8, "v": 10}[kind], 8 if kind == "q" else 2)
        return ("norm", self.norm.data) if kind == "norm" else None


def _shape(m: Experts, name: str) -> tuple[int, ...]:
    return tuple(m.param_view(name)[1].shape)


def _bucket(m: Experts, names: list[str], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    named = {n: torch.randn(_shape(m, n), generator=g).to(m.w13.device, m.w13.dtype) for n in names}
    return (*packed(named), named)


def _apply(m: Experts, key: str, flat: torch.Tensor) -> copyplan.CopyPlan:
    plan = copyplan.plan_for(m, key)
    srcs = [flat[a:b].view(getattr(torch, d)).view(s) for _, d, s, a, b in plan.entries]
    torch._foreach_copy_(plan.run_dsts, copyplan.run_sources(plan, srcs))
    return plan


def _moe_names(experts: range) -> list[str]:
    return [f"{k}.{e}" for e in experts for k in ("gate", "up", "down")]


@pytest.mark.parametrize("pad", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_moe_bucket_lands_bitwise_in_a_few_copies(pad, dtype):
    m = Experts(6, 5, 4, pad, dtype)
    names = ["norm", "q", "k", "v"] + _moe_names(range(1, 6))  # experts 1..5 of 6: a bucket boundary
    key, flat, named = _bucket(m, names)
    plan = _apply(m, key, flat)
    for n, t in named.items():
        assert torch.equal(m.param_view(n)[1], t), n
    assert m.w13[0].abs().sum() == 0 and m.w2[0].abs().sum() == 0  # expert 0 was not in the bucket
    if pad:  # padded rows/columns are never written
        assert m.w13[:, 5:8].abs().sum() == 0 and m.w2[:, :, 5:].abs().sum() == 0
    # norm, q+k+v (one flat block), gate/up (one progression, or two when padded), down: a handful of copies
    assert len(plan.runs) == (4 if not pad else 5) and len(plan.direct) == len(names)


def test_a_dense_bucket_keeps_one_copy_per_tensor_where_nothing_continues():
    m = Experts(2, 5, 4)
    key, flat, named = _bucket(m, ["norm", "down.0", "q", "gate.1"])
    plan = _apply(m, key, flat)
    assert len(plan.runs) == 4 and all(torch.equal(m.param_view(n)[1], t) for n, t in named.items())


@pytest.mark.parametrize("seed", range(12))
def test_random_layouts_land_what_one_copy_per_tensor_lands(seed):
    rng = random.Random(seed)
    pad = rng.choice([0, 2])
    names = _moe_names(range(7)) + ["q", "k", "v", "norm"]
    rng.shuffle(names)
    names = names[: rng.randint(1, len(names))]
    m, ref = Experts(7, 3, 5, pad), Experts(7, 3, 5, pad)
    key, flat, named = _bucket(m, names, seed)
    _apply(m, key, flat)
    for n, t in named.items():
        ref.param_view(n)[1].copy_(t)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), ref.parameters()))


def test_steps_never_overlap_and_unaligned_sources_stay_alone():
    seg = copyruns.Segment
    # two pieces 4 elements apart on the destination but 6 wide: an overlap, so no progression
    runs = copyruns.runs([seg(0, 1, 0, (6,), (1,), "f"), seg(10, 1, 4, (6,), (1,), "f")])
    assert len(runs) == 2
    assert len(copyruns.runs([seg(None, 1, 0, (2,), (1,), "f"), seg(None, 1, 2, (2,), (1,), "f")])) == 2
    three = copyruns.runs([seg(i * 8, 1, i * 4, (4,), (1,), "f") for i in range(3)])
    assert len(three) == 1 and copyruns.views(three[0]) == ((3, 4), (8, 1), (4, 1))


def test_apart_gives_back_a_progressions_pieces():
    seg = copyruns.Segment
    # pairs continue each other on both sides (one piece of 4), and the pieces are 6 and 4 elements apart
    segs = [seg(i * 6 + j * 2, 1, i * 4 + j * 2, (2,), (1,), "f") for i in range(3) for j in range(2)]
    (run,) = copyruns.runs(segs)
    assert run.count == 3 and run.shape == (4,)
    pieces = copyruns.apart(run)
    assert [p.members for p in pieces] == [[0, 1], [2, 3], [4, 5]] and all(p.shape == (4,) for p in pieces)
