"""labkit.engine.inside.apply, the engine-side loader, on a small torch module with the model's two entry points
(`param_view`, `load_weights`): the copy plan lands each tensor in its parameter slice bitwise, names the model
cannot map go through load_weights, a re-created parameter is re-resolved, the layout travels in the name.
The real engine path (SGLang's scheduler calling it) is covered by tests/integration (sync verified bitwise)."""

import importlib

import pytest
import torch
from torch import nn

from labkit.engine.inside import apply
from labkit.engine.inside import copyplan
from labkit.engine.inside import delta
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
    importlib.reload(copyplan)  # module-level plan and mapping caches start empty
    importlib.reload(apply)
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
    assert not apply._mapped  # a buffer not in shared memory (the distributed path's) is never kept


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


def test_a_shared_buffer_stays_mapped_across_syncs_while_the_trainer_sends_it():
    """The next sync's handle resolves to the mapping already faulted in; a buffer a sync did not use (the trainer
    replaced its pool) is let go at that sync's end."""
    m = Model()
    key, flat = _bucket({"q": torch.randn(4, 3), "norm": torch.randn(3)})
    flat.share_memory_()
    other = flat.clone().share_memory_()
    apply.load_flat(m, [(key, flat)])
    apply.load_flat(m, [(key, other)])
    apply.end_sync()
    assert set(apply._mapped) == {flat.data_ptr(), other.data_ptr()}  # both used: both kept for the next sync
    apply.load_flat(m, [(key, flat)])
    apply.end_sync()
    assert set(apply._mapped) == {flat.data_ptr()}


def test_a_recreated_parameter_is_re_resolved():
    m = Model()
    key, flat = _bucket({"norm": torch.randn(3)})
    apply.load_flat(m, [(key, flat)])
    m.norm = nn.Parameter(torch.zeros(3), requires_grad=False)  # e.g. a post-load repack
    apply.load_flat(m, [(key, flat)])
    assert torch.equal(m.norm, flat.view(torch.float32))  # the plan copied into the new parameter


class Rank(nn.Module):
    """One rank of a TP 2 engine's layer, laid out as SGLang's parallel layers hold it: q/k/v of 4 heads / 2 K/V
    heads of dim 2 (`qkv_proj`: 2 q heads + 1 k + 1 v head per rank, per-rank shard sizes as QKVParallelLinear
    has them), o_proj's columns split, gate/up of 40 rows padded to 64 on CPU (MergedColumnParallelLinear's whole
    `output_sizes`), a replicated norm."""

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"num_attention_heads": 4, "num_key_value_heads": 2})()
        a, m = nn.Module(), nn.Module()
        a.qkv_proj, a.o_proj, m.gate_up_proj = nn.Module(), nn.Module(), nn.Module()
        a.qkv_proj.weight = nn.Parameter(torch.zeros(8, 4), requires_grad=False)
        a.qkv_proj.q_proj_shard_size, a.qkv_proj.kv_proj_shard_size, a.qkv_proj.v_proj_shard_size = 4, 2, 2
        a.o_proj.weight = nn.Parameter(torch.zeros(4, 4), requires_grad=False)
        m.gate_up_proj.weight = nn.Parameter(torch.zeros(64, 4), requires_grad=False)
        m.gate_up_proj.output_sizes = [64, 64]
        self.layer = nn.Module()
        self.layer.self_attn, self.layer.mlp = a, m
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.zeros(4), requires_grad=False)
        self.loaded: list[str] = []

    def labkit_fused_part(self, name):
        from labkit.engine.contract import fused_part

        return fused_part(name)

    def param_view(self, name):  # the TP 1 view: asked for replicated tensors only
        return ("norm.weight", self.norm.weight.data) if name == "norm.weight" else None

    def load_weights(self, weights):
        self.loaded += [n for n, _ in weights]


def test_each_rank_of_a_tp2_engine_copies_its_own_piece_as_the_verifier_expects_it(monkeypatch):
    """At TP 2 the copy plan writes each rank's piece of every tensor (labkit.engine.inside.shardview), by the
    rule the verifier hashes each rank's expectation with (labkit.engine.shard): the two agree bitwise, padding
    stays zero, nothing goes to the model's loader. The rank comes from SGLang's runtime context."""
    from sglang.srt import runtime_context

    from labkit.engine.shard import Sharding
    from labkit.sync.verify import engine_layout

    g = torch.Generator().manual_seed(0)
    named = {"layer.self_attn.q_proj.weight": torch.randn(8, 4, generator=g),
             "layer.self_attn.k_proj.weight": torch.randn(4, 4, generator=g),
             "layer.self_attn.v_proj.weight": torch.randn(4, 4, generator=g),
             "layer.self_attn.o_proj.weight": torch.randn(4, 8, generator=g),
             "layer.mlp.gate_proj.weight": torch.randn(40, 4, generator=g),
             "layer.mlp.up_proj.weight": torch.randn(40, 4, generator=g), "norm.weight": torch.randn(4, generator=g)}
    want = engine_layout(named, ffn_pad=64, sharding=Sharding(2, 4, 2))
    key, flat = _bucket(named)
    assert copyplan.tp_rank() == (1, 0)  # outside an engine nothing is published: one rank
    for rank in (0, 1):
        monkeypatch.setattr(runtime_context, "get_parallel", lambda: type("P", (), {"tp_size": 2, "tp_rank": rank})())
        m = Rank()
        apply.load_flat(m, [(key, flat)])
        assert m.loaded == [] and apply.end_sync() == [7, 0]
        got = {"layer.self_attn.qkv_proj.weight": m.layer.self_attn.qkv_proj.weight,
               "layer.self_attn.o_proj.weight": m.layer.self_attn.o_proj.weight,
               "layer.mlp.gate_up_proj.weight": m.layer.mlp.gate_up_proj.weight, "norm.weight": m.norm.weight}
        for name, t in got.items():
            assert torch.equal(t, want[f"{name}#tp{rank}"]), (rank, name)
    assert not m.layer.mlp.gate_up_proj.weight[8:32].any()  # rank 1: 8 real gate rows of 32, the rest zero


def test_a_shape_mismatch_falls_back_and_a_foreign_payload_is_refused():
    m = Model()
    key, flat = _bucket({"q": torch.randn(2, 3), "norm": torch.randn(3)})
    apply.load_flat(m, [(key, flat)])
    assert m.loaded == ["q"]  # the model's loader shards or refuses with its own message
    with pytest.raises(ValueError, match="not a labkit flat bucket"):
        apply.load_flat(m, [("model.norm.weight", flat)])


@pytest.mark.parametrize("sent", [torch.float64, torch.bfloat16, torch.float8_e4m3fn])
def test_a_dtype_mismatch_is_refused_by_name_before_the_bucket_writes_anything(sent):
    """The field's silent failure: a bf16 export sent into an fp8 engine was cast with the old scale by SGLang's
    loader and answered Success. Refused here, naming the tensor and both dtypes; q, in the same bucket and
    planned first, is not written either, and nothing goes to the model's loader."""
    from labkit.engine.contract import ContractMismatch

    m = Model()
    key, flat = _bucket({"q": torch.randn(4, 3), "norm": torch.randn(3).to(sent)})
    with pytest.raises(ContractMismatch, match=rf"'norm': dtype {str(sent).removeprefix('torch.')} sent for an "
                                               "engine parameter of dtype float32"):
        apply.load_flat(m, [(key, flat)])
    assert not m.qkv.any() and not m.norm.any() and m.loaded == []


def test_bench_verdict_fails_when_the_engine_did_not_change_or_a_sync_did_not_verify():
    from labkit.lab.bench.sync import verdict

    before = {"a": "01", "b": "02"}
    assert verdict([True, True], before, {"a": "01", "b": "03"})["bench/verified"] is True
    assert verdict([True, True], before, dict(before))["bench/verified"] is False  # same bytes: proves nothing
    assert verdict([True, False], before, {"a": "09", "b": "03"})["bench/verified"] is False
    assert verdict([], before, {"a": "09"})["bench/verified"] is False


def test_bench_references_are_the_best_samples_and_bounds_follow_the_rates():
    from labkit.lab.bench.reference import bounds
    from labkit.lab.bench.sync_summary import references

    rates = [{"memcpy_gbps": 14.0, "two_copies_gbps": 5.0, "hash_gbps": 9.0},
             {"memcpy_gbps": 19.0, "two_copies_gbps": 6.0, "hash_gbps": 8.0}]
    out = references(rates, {"gloo_gbps": 3.0, "samples_s": [0.1, 0.2]})
    assert out["bench/memcpy_gbps"] == 19.0 and out["bench/memcpy_gbps_samples"] == [14.0, 19.0]
    assert out["bench/two_copies_gbps"] == 6.0 and out["bench/hash_gbps"] == 9.0 and out["bench/gloo_gbps"] == 3.0
    b = bounds(6_000_000_000, {"memcpy_gbps": 20.0, "two_copies_gbps": 6.0, "hash_gbps": 10.0, "gloo_gbps": 3.0})
    assert b["transport_only"] == pytest.approx({"per-tensor": 1.0, "colocated": 1.0, "direct": 0.3,
                                                 "distributed": 2.0})  # two copies; one copy; the wire
    assert b["end_to_end"]["colocated"] == pytest.approx(1.6)  # plus one hash pass of the model


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


def test_a_bucket_packed_into_the_staging_file_is_read_there_and_is_the_rollback_copy(tmp_path):
    """The guarded colocated path: the trainer packs into the guard's staging file (lastgood.Writer.region), the
    engine maps that file once and copies from it; the same bytes are then the indexed rollback copy."""
    from labkit.engine.inside import colocated as stagefile
    from labkit.sync import lastgood
    from labkit.sync.slots import Slots

    store, slots = lastgood.Store(tmp_path), Slots()
    m = Model()
    stagefile._files.clear()
    for version in ("v1", "v2", "v3"):
        named = {"q": torch.randn(4, 3), "k": torch.randn(2, 3), "norm": torch.randn(3)}
        key, packed = _bucket(named)
        w = lastgood.Writer(store.staging(), slots, capacity=16)
        w.region(8)  # a bucket already there: this one starts at an aligned offset past it
        flat = w.region(packed.numel())
        flat.copy_(packed)
        path, offset = w.locate(flat)
        assert offset % lastgood.ALIGN == 0 and w.locate(packed) is None
        apply.load_flat(m, [(stagefile.key(path, offset, key), torch.zeros(1, dtype=torch.uint8))])
        assert torch.equal(m.qkv[:4], named["q"]) and torch.equal(m.qkv[4:], named["k"])
        w.add_packed([(n, t.dtype, tuple(t.shape), o) for (n, t), (_, _, _, o, _) in
                      zip(named.items(), apply.json.loads(key[len(apply.PREFIX):]))], flat)
        store.promote(w.finish(version), version, {})
        assert all(torch.equal(lastgood.load(store.good["path"])[1][n], t) for n, t in named.items())
    assert len(stagefile._files) == 2  # two recycled files, each mapped once by the engine
    assert apply.end_sync() == [9, 0]


def test_the_engine_maps_no_file_but_a_labkit_staging_copy(tmp_path):
    from labkit.engine.inside import colocated as stagefile

    (tmp_path / "data.bin").write_bytes(b"\0" * 64)
    key, _ = _bucket({"norm": torch.randn(3)})
    with pytest.raises(ValueError, match="not a labkit staging file"):
        apply.load_flat(Model(), [(stagefile.key(str(tmp_path / "data.bin"), 0, key), torch.zeros(1))])
    d = tmp_path / "labkit_stage_1_x" / "s1"
    d.mkdir(parents=True)
    (d / "data.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ValueError, match="outside the staging file"):
        apply.load_flat(Model(), [(stagefile.key(str(d / "data.bin"), 0, key), torch.zeros(1))])


def test_a_faulted_apply_runs_the_plans_own_copies_and_stops_between_two(monkeypatch):
    """`labkit faults`' engine.apply point: the same merged copies as a normal sync, the fault between two."""
    from labkit import failpoints as fp

    m = Model()
    named = {"q": torch.randn(4, 3), "norm": torch.randn(3), "k": torch.randn(2, 3)}  # three runs, not one merged
    key, flat = _bucket(named)
    seen = []
    real = copyplan.run_sources
    monkeypatch.setattr(copyplan, "run_sources", lambda plan, srcs: seen.append(plan) or real(plan, srcs))
    monkeypatch.setattr(fp, "engine_armed", lambda point: True)
    monkeypatch.setitem(fp._ARMED, "engine.apply", fp.Armed("engine.apply", "raise", 1, match="k"))
    with pytest.raises(fp.FaultInjected):
        apply.load_flat(m, [(key, flat)])
    assert seen and seen[0] is copyplan.plan_for(m, key)  # the compiled plan's runs, as a normal sync copies
    assert torch.equal(m.qkv[:4], named["q"]) and torch.equal(m.norm, named["norm"])  # the runs before k landed
    assert not m.qkv[4:].any()  # k did not: a half-written group


def test_a_delta_payload_can_be_faulted(monkeypatch):
    from labkit import failpoints as fp

    m = Model()
    key, _ = _bucket({"q": torch.randn(4, 3), "k": torch.randn(2, 3)})
    monkeypatch.setattr(fp, "engine_armed", lambda point: True)
    monkeypatch.setitem(fp._ARMED, "engine.apply", fp.Armed("engine.apply", "raise", 1, match="k"))
    with pytest.raises(fp.FaultInjected):
        apply._apply_delta(m, f"{apply.DELTA_PREFIX}4:6:index:{key}", torch.zeros(0, dtype=torch.uint8))
    assert not m.qkv.any()  # the fault fired before the bucket's changed words were written
