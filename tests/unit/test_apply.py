"""labkit.engine.apply, the engine-side loader, on a small torch module with the model's two entry points
(`param_view`, `load_weights`): the copy plan lands each tensor in its parameter slice bitwise, names the model
cannot map go through load_weights, a re-created parameter is re-resolved, the layout travels in the name.
The real engine path (SGLang's scheduler calling it) is covered by tests/integration (sync verified bitwise)."""

import importlib

import pytest
import torch
from torch import nn

from labkit.engine import apply, delta
from labkit.engine.config import APPLY_FORMAT


class Model(nn.Module):
    """q/k fused into qkv rows [0:4] and [4:6]; `norm` plain; anything else goes to load_weights."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Parameter(torch.zeros(6, 3), requires_grad=False)
        self.norm = nn.Parameter(torch.zeros(3), requires_grad=False)
        self.loaded: list[str] = []

    def param_view(self, name):
        rows = {"q": (0, 4), "k": (4, 2)}
        if name in rows:
            return "qkv", self.qkv.data.narrow(0, *rows[name])
        return ("norm", self.norm.data) if name == "norm" else None

    def load_weights(self, weights):
        self.loaded += [n for n, _ in weights]


def _bucket(named: dict[str, torch.Tensor]):
    entries, parts, off = [], [], 0
    for n, t in named.items():
        raw = t.contiguous().view(-1).view(torch.uint8)
        entries.append((n, str(t.dtype).removeprefix("torch."), tuple(t.shape), off, off + raw.numel()))
        parts.append(raw)
        off += raw.numel()
    return apply.layout_key(entries), torch.cat(parts)


@pytest.fixture(autouse=True)
def fresh():
    importlib.reload(apply)  # module-level plan and mapping caches start empty
    yield


def test_format_is_the_loaders_import_path():
    assert APPLY_FORMAT == f"{apply.load_flat.__module__}.{apply.load_flat.__qualname__}"


def test_copy_plan_lands_every_tensor_bitwise_and_counts_paths():
    m = Model()
    named = {"q": torch.randn(4, 3), "k": torch.randn(2, 3), "norm": torch.randn(3), "extra": torch.randn(2)}
    key, flat = _bucket(named)
    apply.load_flat(m, [(key, flat)])
    assert torch.equal(m.qkv[:4], named["q"]) and torch.equal(m.qkv[4:], named["k"])
    assert torch.equal(m.norm, named["norm"])
    assert m.loaded == ["extra"]  # unmapped: the model's own loader
    assert apply.end_sync() == [3, 1] and apply.end_sync() == [0, 0]
    assert not apply._mapped  # the engine holds no shared memory between syncs


def test_a_kept_buffer_is_reused_and_new_bytes_in_it_land():
    m = Model()
    key, flat = _bucket({"q": torch.randn(4, 3), "norm": torch.randn(3)})
    flat.share_memory_()  # as the colocated transport's pool: only shared buffers are kept mapped
    apply.load_flat(m, [(key, flat)])
    views = apply._mapped[flat.data_ptr()][1][key]
    new = {"q": torch.randn(4, 3), "norm": torch.randn(3)}
    flat.copy_(_bucket(new)[1])  # the trainer packs a later bucket of this sync into the same buffer
    apply.load_flat(m, [(key, flat)])
    assert apply._mapped[flat.data_ptr()][1][key] is views  # no new views, no new mapping
    assert torch.equal(m.qkv[:4], new["q"]) and torch.equal(m.norm, new["norm"])


def test_a_recreated_parameter_is_re_resolved():
    m = Model()
    key, flat = _bucket({"norm": torch.randn(3)})
    apply.load_flat(m, [(key, flat)])
    m.norm = nn.Parameter(torch.zeros(3), requires_grad=False)  # e.g. a post-load repack
    apply.load_flat(m, [(key, flat)])
    assert torch.equal(m.norm, flat.view(torch.float32))  # the plan copied into the new parameter


def test_shape_or_dtype_mismatch_falls_back_and_a_foreign_payload_is_refused():
    m = Model()
    key, flat = _bucket({"q": torch.randn(2, 3), "norm": torch.randn(3, dtype=torch.float64)})
    apply.load_flat(m, [(key, flat)])
    assert m.loaded == ["q", "norm"]  # the model's loader casts, shards or refuses with its own message
    with pytest.raises(ValueError, match="not a labkit flat bucket"):
        apply.load_flat(m, [("model.norm.weight", flat)])


def test_bench_verdict_fails_when_the_engine_did_not_change_or_a_sync_did_not_verify():
    from labkit.workbench.sync_bench import verdict

    before = {"a": "01", "b": "02"}
    assert verdict([True, True], before, {"a": "01", "b": "03"})["bench/verified"] is True
    assert verdict([True, True], before, dict(before))["bench/verified"] is False  # same bytes: proves nothing
    assert verdict([True, False], before, {"a": "09", "b": "03"})["bench/verified"] is False
    assert verdict([], before, {"a": "09"})["bench/verified"] is False


def _delta(old: dict, new: dict):
    """(delta payload name, payload) taking a bucket from `old` to `new`, as labkit.sync.delta sends it."""
    key, flat_new = _bucket(new)
    shadow = _bucket(old)[1]
    word = delta.word_bytes(t.element_size() for t in new.values())
    out = torch.empty(flat_new.numel(), dtype=torch.uint8)
    payload, _, encoding = delta.encode(flat_new, shadow, word, out)
    return apply.delta_key(key, word, flat_new.numel() // word, encoding), payload


def test_a_delta_payload_lands_bitwise_through_the_plan():
    m = Model()
    old = {"q": torch.randn(4, 3), "norm": torch.randn(3)}
    key, flat = _bucket(old)
    apply.load_flat(m, [(key, flat)])
    new = {"q": old["q"].clone(), "norm": old["norm"].clone()}
    new["q"][2, 1] = 7.0  # one word of q, one of norm
    new["norm"][0] = -0.0 if old["norm"][0] != 0 else 1.0
    name, payload = _delta(old, new)
    assert payload.numel() < flat.numel()
    apply.load_flat(m, [(name, payload)])
    assert torch.equal(m.qkv[:4].view(torch.int32), new["q"].view(torch.int32))
    assert torch.equal(m.norm.view(torch.int32), new["norm"].view(torch.int32))  # bitwise: -0.0 is not 0.0
    assert apply.end_sync() == [4, 0]


def test_a_delta_for_a_bucket_the_plan_cannot_hold_is_refused_before_any_write():
    m = Model()
    old = {"q": torch.zeros(4, 3), "extra": torch.zeros(2)}
    new = {"q": torch.ones(4, 3), "extra": torch.zeros(2)}
    name, payload = _delta(old, new)
    with pytest.raises(ValueError, match=r"delta sync needs every tensor.*'extra'.*delta=0"):
        apply.load_flat(m, [(name, payload)])
    assert not m.qkv.any()  # nothing half-applied


def test_routes_names_labkit_payloads_only():
    assert apply.routes([(apply.PREFIX + "[]", None)]) and apply.routes([(apply.DELTA_PREFIX + "2:1:mask:", None)])
    assert not apply.routes([("model.norm.weight", None)]) and not apply.routes([])


def test_layout_of_reads_names_and_shapes_from_either_payload_name():
    key, _ = _bucket({"q": torch.zeros(4, 3), "norm": torch.zeros(3)})
    assert apply.layout_of(key) == [("q", (4, 3)), ("norm", (3,))]
    assert apply.layout_of(apply.delta_key(key, 4, 15, "index")) == [("q", (4, 3)), ("norm", (3,))]
