"""The syncer's per-bucket hooks (labkit/sync/hooks.py): a new hook needs no change to the loop, the rollback
copy is written while sending and complete only once the session closed, and a failed sync aborts every hook
and closes the session without masking the original error. Engine stand-in: test_verify_export.Recorder."""

import pytest
import torch

from labkit import failpoints as fp
from labkit.sync import hooks as hk
from labkit.sync import lastgood
from labkit.sync.config import SyncConfig
from labkit.sync.session import Syncer
from tests.unit.test_verify_export import CFG, Recorder, _export, _spec


@pytest.fixture(autouse=True)
def _clean():
    fp.disarm()
    yield
    fp.disarm()


class Counting:
    phase = "verify"

    def __init__(self):
        self.buckets, self.names, self.finished, self.aborted = 0, [], [], False

    def on_bucket(self, b, tensors, flat):
        self.buckets += 1
        self.names += list(tensors)

    def finish(self, engine, version):
        self.finished.append(version)
        return {"test/counted": self.buckets}

    def abort(self):
        self.aborted = True


def _with(monkeypatch, extra):
    real = hk.for_config
    monkeypatch.setattr(hk, "for_config",
                        lambda cfg, plan=None, spec=None, slots=None: real(cfg, plan, spec, slots) + [extra])


def test_a_new_hook_sees_every_bucket_and_its_metrics_come_back(monkeypatch):
    counting = Counting()
    _with(monkeypatch, counting)
    m = Syncer().run(_export(), Recorder(), SyncConfig(**CFG), _spec(), weight_version="v7")
    assert m["sync/verified"] is True and m["sync/num_buckets"] > 1
    assert counting.buckets == m["sync/num_buckets"] and m["test/counted"] == counting.buckets
    assert sorted(counting.names) == sorted(n for n, _ in _export())
    assert counting.finished == ["v7"] and not counting.aborted


def test_the_rollback_copy_is_the_exported_weights_and_complete_only_after_the_session(tmp_path):
    stage = tmp_path / "copy"
    m = Syncer().run(_export(), Recorder(), SyncConfig(stage_dir=str(stage), **CFG), _spec(), weight_version="v3")
    assert m["sync/staged"] == str(stage) and lastgood.is_complete(stage) and m["sync/stage_bytes"] > 0
    version, tensors = lastgood.load(stage)
    assert version == "v3"
    for n, t in _export():
        assert torch.equal(tensors[n], t), n
    assert m["timing/sync/stage"] > 0


class Failing(Recorder):
    def end_weight_update(self):
        self.calls.append("end_weight_update")
        raise RuntimeError("engine gone")


@pytest.mark.parametrize("transport", ["colocated", "per-tensor"])
def test_a_failed_sync_aborts_every_hook_and_keeps_the_original_error(transport, tmp_path, monkeypatch):
    counting = Counting()
    _with(monkeypatch, counting)
    stage = tmp_path / "copy"
    engine = Failing()
    fp.arm("sync.bucket", "raise", nth=2)
    cfg = SyncConfig(**{**CFG, "transport": transport, "stage_dir": str(stage)})
    with pytest.raises(fp.FaultInjected, match="sync.bucket"):
        Syncer().run(_export(), engine, cfg, _spec())
    assert counting.aborted and not counting.finished
    assert not stage.exists()  # the unfinished copy is removed, never mistaken for a rollback source
    assert "end_weight_update" in engine.calls and "set_weight_version" not in engine.calls


def test_alternating_transports_replay_each_plan_and_the_pool_is_sized_to_the_plan():
    """A bench that interleaves per-tensor and bucketed syncs (or a tuner's trials) replays each plan: only the
    first sync of each (bucket size, dtype) is cold, and the pool matches the plan it serves."""
    syncer, engine = Syncer(), Recorder()
    cold = []
    for transport in ("per-tensor", "colocated", "per-tensor", "colocated", "per-tensor"):
        m = syncer.run(_export(), engine, SyncConfig(**{**CFG, "transport": transport}), _spec())
        cold.append(m["sync/cold"])
        assert m["sync/verified"] is True
    assert cold == [True, True, False, False, False]
    bucketed = next(p for (size, *_), p in syncer.plans.items() if size != 1)
    assert len(syncer.plans) == 2 and syncer.pool.nbytes == max(b.nbytes for b in bucketed.buckets if not b.oversize)
    m = syncer.run(_export(), engine, SyncConfig(**{**CFG, "bucket_mb": 0.001}), _spec())  # a larger bucket
    assert m["sync/cold"] is True and syncer.pool.nbytes == max(b.nbytes for b in syncer.plan.buckets if not b.oversize)
