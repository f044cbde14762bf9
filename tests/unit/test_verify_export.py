"""Verification that cannot be fooled: expected checksums come from the trainer's export, not from the packed
buffer; every engine tensor is sent or named; an empty sync and an unguarded verify="none" are refused.

`Recorder` is a stand-in for the engine that stores exactly the bytes it receives and hashes them the way
SGLang does. It exists only to unit-test the verification logic against a deliberately broken packer
(tests/integration/test_sync.py covers the same behaviour against the real engine).
"""

import pytest
import torch

from labkit.sync import bucket as bk
from labkit.sync.plan import TensorMeta, check_coverage, plan_buckets
from labkit.sync.session import SyncConfig, Syncer
from labkit.sync.verify import expected_checksums

DTYPE = "float32"


def _export():
    g = torch.Generator().manual_seed(1)
    return [
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(8, 4, generator=g)),
        ("model.layers.0.self_attn.k_proj.weight", torch.randn(4, 4, generator=g)),
        ("model.layers.0.self_attn.v_proj.weight", torch.randn(4, 4, generator=g)),
        ("model.layers.0.mlp.down_proj.weight", torch.randn(4, 16, generator=g)),
        ("model.mtp_layers.0.norm.weight", torch.randn(4, generator=g)),
        ("model.norm.weight", torch.randn(4, generator=g)),
        ("lm_head.weight", torch.randn(5, 4, generator=g)),
    ]


def _spec(dtype=DTYPE):
    return {"tensors": {n: (tuple(t.shape), dtype) for n, t in _export()}, "dtype": dtype}


class Recorder:
    """Engine stand-in: keeps what it is sent (colocated flattened buckets or per-tensor), hashes that."""

    tp_size = 1

    def __init__(self, dtype=DTYPE):
        self.weights = {n: torch.zeros(t.shape, dtype=getattr(torch, dtype)) for n, t in _export()}
        self.calls = []

    def update_weights_from_tensor(self, named, load_format=None, flush_cache=True):
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        self.calls.append("update")
        if load_format == "flattened_bucket":
            data = MultiprocessingSerializer.deserialize(named[0])
            named = FlattenedTensorBucket(flattened_tensor=data["flattened_tensor"],
                                          metadata=data["metadata"]).reconstruct_tensors()
        for n, t in named:
            self.weights[n] = t.clone()

    def checksums(self):
        return expected_checksums(self.weights)

    def get_weights_by_name(self, name):
        return self.weights[name]

    def node(self):  # in this process, like a colocated engine
        return {"node_id": self.node_id, "node_ip": "127.0.0.1"}

    node_id = None

    def __getattr__(self, name):  # begin/end_weight_update, flush_cache, set_weight_version, ...
        return lambda *a, **k: self.calls.append(name)


def _run(cfg, exclude=(), export=None, dtype=DTYPE):
    engine = Recorder(dtype)
    m = Syncer().run(export if export is not None else _export(), engine, cfg, _spec(dtype), exclude=exclude)
    return m, engine


CFG = dict(transport="colocated", bucket_mb=0.0002, progress=False, atomic=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("verify", ["checksum", "full"])
def test_honest_sync_verifies(verify, dtype):
    m, engine = _run(SyncConfig(verify=verify, **CFG), dtype=dtype)
    assert m["sync/verified"] is True and m["sync/num_buckets"] > 1, m
    assert m["sync/unverified"] == [] and m["sync/num_unverified"] == 0


def _buggy(bug, pack):
    """bk.pack with a bug: one byte of bucket 1 flipped, or a cast through float16 (plausible cast bug)."""
    def bad(bucket, tensors, out):
        if bug == "wrong_cast":
            return pack(bucket, {n: t.half().float() for n, t in tensors.items()}, out)
        flat = pack(bucket, tensors, out)
        if bucket.index == 1:
            flat[3] ^= 0xFF
        return flat
    return bad


@pytest.mark.parametrize("verify", ["checksum", "full"])
@pytest.mark.parametrize("bug", ["corrupt_byte", "wrong_cast"])
def test_a_packing_bug_fails_verification(bug, verify, monkeypatch):
    """The engine gets exactly the packed bytes; were the expectation hashed from them, this would verify."""
    monkeypatch.setattr(bk, "pack", _buggy(bug, bk.pack))
    m, engine = _run(SyncConfig(verify=verify, **CFG))
    assert m["sync/verified"] is False, m
    assert m["verify/mismatched"], m


def test_excluded_tensors_are_reported_unverified_not_sent():
    m, engine = _run(SyncConfig(**CFG), exclude=(".mtp_layers.",))
    assert m["sync/verified"] is True
    assert m["sync/unverified"] == ["model.mtp_layers.0.norm.weight"] and m["sync/num_unverified"] == 1
    assert not engine.weights["model.mtp_layers.0.norm.weight"].any()  # left as it was


def test_a_tensor_missing_from_the_export_is_refused_before_anything_is_sent():
    export = [(n, t) for n, t in _export() if n != "model.layers.0.mlp.down_proj.weight"]
    with pytest.raises(ValueError, match=r"incomplete sync refused: 1 engine tensors .*down_proj"):
        _run(SyncConfig(**CFG), export=export)
    engine = Recorder()
    with pytest.raises(ValueError):
        Syncer().run(export, engine, SyncConfig(**CFG), _spec())
    assert engine.calls == []


@pytest.mark.parametrize("exclude,export,match", [
    (("model.", "lm_head"), None, r"empty sync refused: exclude=\('model.', 'lm_head'\) matched all 7 tensors"),
    ((), [], "empty sync refused: the trainer's export has no tensors"),
])
def test_an_empty_sync_is_refused_naming_why(exclude, export, match):
    engine = Recorder()
    with pytest.raises(ValueError, match=match):
        Syncer().run(export if export is not None else _export(), engine, SyncConfig(**CFG), _spec(),
                     exclude=exclude)
    assert engine.calls == []


def test_check_coverage_is_pure_and_names_the_missing():
    metas = [TensorMeta(n, tuple(t.shape), DTYPE) for n, t in _export()[:3]]
    plan = plan_buckets(metas, 1 << 20)
    engine = _spec()["tensors"]
    with pytest.raises(ValueError, match="incomplete sync refused: 4 engine tensors"):
        check_coverage(plan, engine)
    assert check_coverage(plan, engine, ("mlp", "norm", "lm_head")) == [
        "model.layers.0.mlp.down_proj.weight", "model.mtp_layers.0.norm.weight", "model.norm.weight",
        "lm_head.weight"]
    assert check_coverage(plan, None) is None


def test_verify_none_needs_unsafe_skip_verify_under_the_atomic_guard():
    with pytest.raises(ValueError, match=r"verify='none' is refused by the atomic guard.*unsafe_skip_verify=True"):
        SyncConfig(verify="none")
    assert SyncConfig(verify="none", unsafe_skip_verify=True).unsafe_skip_verify
    SyncConfig(verify="none", atomic=False)  # the bare transport (benchmarks) verifies nothing by design
    with pytest.raises(ValueError, match="unsafe_skip_verify='yes'"):
        SyncConfig(unsafe_skip_verify="yes")


def test_a_handle_passing_sync_to_an_engine_on_another_node_is_refused_before_the_session(monkeypatch):
    """Colocated and per-tensor hand the engine a shared-memory handle: across Ray nodes the engine would open a file
    that is not there. Refused while preparing (no engine call made), naming both nodes."""
    from labkit.cluster import runtime
    from labkit.cluster.placement import PlacementError

    monkeypatch.setattr(runtime, "here", lambda: {"node_id": "a" * 56, "node_ip": "127.0.0.1"})
    for transport in ("colocated", "per-tensor"):
        engine = Recorder()
        engine.node_id = "b" * 56
        with pytest.raises(PlacementError, match=f"transport='{transport}'.*127.0.0.1/aaaaaaaa.*127.0.0.1/bbbbbbbb"):
            Syncer().run(_export(), engine, SyncConfig(**{**CFG, "transport": transport}), _spec(DTYPE))
        assert engine.calls == []
        engine.node_id = "a" * 56  # the same node: it goes through and says where it ran
        m = Syncer().run(_export(), engine, SyncConfig(**{**CFG, "transport": transport}), _spec(DTYPE))
        assert m["sync/verified"] is True and m["sync/cross_node"] is False
        assert m["sync/trainer_node"] == m["sync/engine_node"] == "127.0.0.1/aaaaaaaa"
