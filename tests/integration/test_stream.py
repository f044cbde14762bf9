"""labkit.sync.stream: any (name, tensor) iterator from the driver into the real engine, no trainer.

The model dir's own weights plus a known delta are streamed in; the engine must then serve exactly those bytes
(its checksums equal the ones computed here, and a read-back is bitwise equal). Controls: an expectation one ulp
off does not match, and bytes damaged in transit fail verification and are rolled back by the atomic guard.
"""

import os

import pytest
import torch

from labkit import failpoints as fp
from labkit.sync import SyncConfig, stream
from labkit.sync import verify as vf
from labkit.sync.atomic import SyncFailed, guard_for
from tests.integration.conftest import restore_model_dir, shm_leftovers

pytestmark = pytest.mark.integration

FAST = dict(bucket_mb=0.02, progress=False, timeout_s=60.0, deadline_s=120.0)


@pytest.fixture
def shifted(engine, engine_model_dir):
    """The model dir's tensors, each float tensor shifted by a seeded delta (so every tensor changes)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(1234)
    out = {}
    for n, t in load_file(str(engine_model_dir / "model.safetensors")).items():
        out[n] = (t.float() + 0.01 * torch.randn(t.shape, generator=g)).to(t.dtype) if t.is_floating_point() else t
    yield out
    restore_model_dir(engine, engine_model_dir)


@pytest.mark.parametrize("transport,atomic", [("colocated", True), ("per-tensor", False)])
def test_stream_lands_a_shifted_model_bitwise(transport, atomic, engine, shifted):
    before = engine.checksums()
    m = stream(iter(shifted.items()), engine, SyncConfig(transport=transport, atomic=atomic, **FAST),
               weight_version=f"stream-{transport}")
    assert m["sync/verified"] is True, m
    assert m.get("sync/atomic", False) is atomic
    assert m["sync/num_unverified"] == 0 and m["verify/num_checked"] == len(before)  # the engine's (fused) tensors
    assert engine.weight_version == f"stream-{transport}"
    now = engine.checksums()
    assert now == vf.expected_checksums({n: t.float() for n, t in shifted.items()})
    assert all(now[n] != before[n] for n in before)  # every tensor really moved
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(engine.get_weights_by_name(name), shifted[name].float())
    # Control: the comparison is bitwise, one ulp off in one tensor is a mismatch.
    off = dict(shifted)
    off[name] = torch.nextafter(off[name].float(), torch.tensor(float("inf")))
    assert vf.expected_checksums(off) != now
    mine = [f for f in shm_leftovers() if f"/torch_{os.getpid()}_" in f]
    assert not mine, f"stream left its shared-memory buffers behind: {mine}"


def test_stream_damaged_in_transit_fails_verification_and_is_rolled_back(engine, shifted):
    good = stream(shifted.items(), engine, SyncConfig(transport="colocated", **FAST), weight_version="good")
    assert good["sync/verified"] is True
    sums, version = engine.checksums(), engine.weight_version
    again = {n: t + 1.0 if t.is_floating_point() else t for n, t in shifted.items()}
    fp.arm("transport.send", "corrupt", nth=2)  # the driver sends: armed in this process
    try:
        with pytest.raises(SyncFailed, match="verification failed") as e:
            stream(again.items(), engine, SyncConfig(transport="colocated", **FAST), weight_version="damaged")
        assert fp.disarm() == {"transport.send": 1}
    finally:
        fp.disarm()
    assert e.value.restored and e.value.metrics["sync/weight_version"] == "good"
    assert e.value.metrics["sync/trainer_alive"] is True  # a local producer is never fenced
    assert engine.checksums() == sums and engine.weight_version == version
    assert guard_for(engine) is guard_for(engine)  # one guard per engine, kept by the sync layer


def test_stream_refuses_before_anything_moves(engine, shifted):
    sums = engine.checksums()
    bad = dict(shifted)
    bad.pop("model.norm.weight")
    with pytest.raises(ValueError, match="model.norm.weight"):
        stream(bad.items(), engine, SyncConfig(transport="colocated", atomic=False, **FAST))
    with pytest.raises(SyncFailed, match="model.norm.weight") as e:
        stream(bad.items(), engine, SyncConfig(transport="colocated", **FAST))
    assert e.value.restored
    with pytest.raises(ValueError, match="exclude"):
        stream(shifted.items(), engine, SyncConfig(**FAST), exclude="mtp")
    assert engine.checksums() == sums
