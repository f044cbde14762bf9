"""The delta codec, the trainer's delta state and the bucket pack on a CUDA device, byte for byte against the CPU.

Needs torch with CUDA only (no SGLang, Megatron or Ray): these are the sync's device-side pieces that run on a GPU
box exactly as written, so they run wherever a GPU is lent (`pytest -m gpu tests/gpu/test_gpu_codec.py`)."""

import pytest
import torch

from labkit.engine.inside import delta
from labkit.sync import bucket as bk
from labkit.sync.delta import DeltaState
from labkit.sync.plan import TensorMeta, plan_buckets

pytestmark = pytest.mark.gpu


def _pair(n: int, frac: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, new) bf16 words: a fraction changed, plus NaN and -0.0 words that did not change."""
    g = torch.Generator().manual_seed(seed)
    old = (torch.randn(n, generator=g) * 0.02).bfloat16()
    old[::97] = float("nan")
    old[5::101] = -0.0
    new = old.clone()
    hit = torch.rand(n, generator=g) < frac
    new.view(torch.int16)[hit] += 1
    return old, new


@pytest.mark.parametrize("frac", [0.0, 0.01, 0.13, 1.0])
def test_codec_on_cuda_writes_the_cpu_payload_and_decodes_bitwise(frac):
    old, new = _pair(100_003, frac, seed=int(frac * 100))
    payloads = {}
    for dev in ("cpu", "cuda"):
        shadow = old.to(dev).view(torch.uint8).clone()
        out = torch.empty(2 * new.numel(), dtype=torch.uint8, device=dev)
        r = delta.encode(new.to(dev).view(torch.uint8), shadow, 2, out)
        assert torch.equal(shadow.cpu(), new.view(torch.uint8))  # the copy is brought up to date either way
        payloads[dev] = None if r is None else (r[0].cpu(), r[1], r[2])
    assert (payloads["cpu"] is None) == (payloads["cuda"] is None)
    if payloads["cpu"] is None:
        return  # all changed: sent whole on both
    (p_cpu, k_cpu, e_cpu), (p_gpu, k_gpu, e_gpu) = payloads["cpu"], payloads["cuda"]
    assert (k_cpu, e_cpu) == (k_gpu, e_gpu) and torch.equal(p_cpu, p_gpu)
    n, cut = new.numel(), 40_000  # two destinations: the payload's indices are split between them
    dst = old.cuda()
    spans, dsts = [(0, 2 * cut), (2 * cut, 2 * n)], [dst[:cut], dst[cut:]]
    assert delta.decode_into(p_gpu.cuda(), 2, n, spans, dsts, e_gpu) == k_gpu
    assert torch.equal(dst.cpu().view(torch.int16), new.view(torch.int16))


def test_delta_state_on_cuda_keeps_its_copy_and_payload_on_the_device():
    """Five versions through the trainer's DeltaState on CUDA (anchor, then deltas), decoded on the device:
    the engine's words equal each version's bitwise."""
    metas = [TensorMeta("a", (4096,), "bfloat16"), TensorMeta("b", (1000,), "bfloat16")]
    plan = plan_buckets(metas, 1 << 20)
    d = DeltaState(anchor_every=8, device="cuda")
    engine = {m.name: torch.zeros(m.shape, dtype=torch.bfloat16, device="cuda") for m in metas}
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = {m.name: torch.randn(m.shape, generator=g, device="cuda") for m in metas}
    kinds = []
    for v in range(5):
        weights = {k: w + 1e-3 * torch.randn(w.shape, generator=g, device="cuda") for k, w in weights.items()}
        d.begin(plan, engine_version=None if v == 0 else f"v{v}")
        kinds.append(d.anchor)
        for b in plan.buckets:
            flat = bk.pack(b, weights, torch.empty(b.nbytes, dtype=torch.uint8, device="cuda"))
            payload, key = d.encode(b, flat, "layout")
            assert payload.device.type == "cuda"
            spans = [(a, e) for _, a, e in bk.spans(b)]
            dsts = [engine[m.name] for m in b.tensors]
            if key == "layout":  # whole: the anchor
                for (name, view) in bk.unpack(b, payload):
                    engine[name].copy_(view)
            else:
                word, n_words, encoding = key.removeprefix("labkit-delta/1:").split(":")[:3]
                delta.decode_into(payload, int(word), int(n_words), spans, dsts, encoding)
        d.commit(f"v{v + 1}")
        for m in metas:
            assert torch.equal(engine[m.name].view(torch.int16), weights[m.name].bfloat16().view(torch.int16))
    assert kinds == [True, False, False, False, False]
    assert 0 < d.metrics()["sync/wire_bytes"] < plan.total_bytes
    d.close()


def test_pack_on_cuda_equals_the_cpu_pack_byte_for_byte():
    """One run per dtype on the device (torch.cat, or one multi-tensor copy where fp32 is cast to bf16),
    transposed sources in C order."""
    g = torch.Generator().manual_seed(1)
    named = {"a.weight": torch.randn(3, 5, generator=g), "b.weight": torch.randn(7, 4, generator=g).t(),
             "c.weight": torch.randn(6, generator=g), "d.weight": torch.randn(300, 17, generator=g)}
    metas = [TensorMeta(n, tuple(t.shape), "bfloat16" if n in ("c.weight", "d.weight") else "float32")
             for n, t in named.items()]
    (b,) = plan_buckets(metas, 1 << 20).buckets
    on_cpu = bk.pack(b, named, torch.empty(b.nbytes, dtype=torch.uint8)).clone()
    on_gpu = bk.pack(b, {n: t.cuda() for n, t in named.items()},
                     torch.empty(b.nbytes, dtype=torch.uint8, device="cuda"))
    assert torch.equal(on_gpu.cpu(), on_cpu)


def test_codec_bench_on_cuda_checks_itself():
    from labkit.lab.bench.codec import bench_codec

    out = bench_codec("cuda", bucket_mb=4, reps=2)
    assert out["bench/codec/verified"] is True and out["bench/pack/verified"] is True
    assert out["bench/codec/device"] == torch.cuda.get_device_name()
