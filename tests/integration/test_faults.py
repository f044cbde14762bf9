"""Faults in the middle of a sync, against the real engine and trainer: each one leaves the engine serving
the old weights bitwise (checksums and weight_version before == after), refusing to generate while the sync
is held mid-way, and the next sync lands verified without restarting anything but what the fault killed."""

import os
import shutil
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest

from labkit.config import ParallelSpec, TrainConfig
from labkit.lab.faults.plan import QUICK_KINDS
from tests.integration.conftest import restore_model_dir
from labkit.sync import SyncConfig, engine_spec
from labkit import failpoints as fp
from labkit.sync.atomic import SyncFailed, guard_for

pytestmark = pytest.mark.integration

FAST = {"bucket_mb": 0.02, "progress": False, "timeout_s": 8.0, "deadline_s": 20.0}


@pytest.fixture(scope="module")
def trainer_box(engine, engine_model_dir):
    """A mutable box: tests that kill the trainer put a new one in."""
    from labkit.trainer.group import Trainer

    box = {"t": Trainer(str(engine_model_dir), ParallelSpec(), TrainConfig(lr=3e-3)), "dir": str(engine_model_dir)}
    yield box
    box["t"].shutdown()
    restore_model_dir(engine, engine_model_dir)



def _new_trainer(box):
    from labkit.trainer.group import Trainer

    box["t"].shutdown()
    box["t"] = Trainer(box["dir"], ParallelSpec(), TrainConfig(lr=3e-3))


def _train(trainer, seed):
    from labkit.tasks import arith

    trainer.train_step(*arith.batch(arith.problems(8, seed=seed)))


def _spec(engine):
    return engine_spec(engine.cfg.model_dir, engine.cfg.dtype)


def _serves(engine) -> bool:
    try:
        engine.generate(input_ids=[[5, 6, 7]], sampling={"max_new_tokens": 2, "temperature": 0})
        return True
    except Exception:
        return False


def _gate(tmp):
    marker, gate = f"{tmp}/reached", f"{tmp}/gate"
    Path(gate).touch()
    return marker, gate


def _kill_at_marker(marker, gate, engine, target, seen):
    import ray

    for _ in range(600):
        if os.path.exists(marker):
            break
        time.sleep(0.05)
    seen["reached"] = os.path.exists(marker)
    # the gate must hold here: a request is refused, or held (not answered) for as long as the sync is held
    seen["served_mid_sync"] = _serves(engine.portable(call_timeout_s=2))
    if target is not None:
        ray.kill(target, no_restart=True)
        time.sleep(0.5)
    Path(gate).unlink(missing_ok=True)


def _fault_sync(box, engine, transport, point, action, nth=1, kill=None, **cfg):
    """Arm one failpoint in the trainer, run an atomic sync, return (error, before, version_before, seen)."""
    trainer = box["t"]
    _train(trainer, seed=zlib.crc32(f"{transport}/{point}/{action}".encode()) % 997)  # stable across runs
    guard = guard_for(engine)
    guard.sync(trainer, SyncConfig(transport="colocated", **FAST), _spec(engine))  # a known last good copy
    _train(trainer, seed=7 + nth)
    before, v_before = engine.checksums(), engine.weight_version
    seen, th, kw, tmp = {}, None, {}, tempfile.mkdtemp(prefix="labkit_fault_")
    if action in ("wait", "hang"):
        kw = dict(zip(("marker", "gate"), _gate(tmp)), limit_s=120)
    fp.arm_in_actor(trainer.actors[0], point, action, nth, **kw)
    if action == "wait":
        target = trainer.actors[0] if kill == "trainer" else engine._actor
        th = threading.Thread(target=_kill_at_marker, args=(kw["marker"], kw["gate"], engine, target, seen))
        th.start()
    with pytest.raises(SyncFailed) as err:
        guard.sync(trainer, SyncConfig(transport=transport, **{**FAST, **cfg}), _spec(engine))
    if th is not None:
        th.join(30)
    shutil.rmtree(tmp, ignore_errors=True)
    return err.value, before, v_before, seen


def _assert_restored(err, engine, before, v_before):
    assert err.restored, err
    assert engine.checksums() == before, "the engine must serve the old weights bitwise"
    assert engine.weight_version == v_before
    assert _serves(engine)


def _next_sync_lands(box, engine, transport="colocated"):
    _train(box["t"], seed=4242)
    m = guard_for(engine).sync(box["t"], SyncConfig(transport=transport, **FAST), _spec(engine))
    assert m["sync/verified"] is True and engine.weight_version == m["sync/weight_version"]
    assert engine.checksums() != {} and _serves(engine)


def test_unknown_and_misshaped_tensors_are_refused_before_sending(engine, trainer_box):
    import torch

    from labkit.engine import EngineError

    before, version = engine.checksums(), engine.weight_version
    engine.begin_weight_update()
    try:
        with pytest.raises(EngineError, match="'model.layers.0.no_such.weight': not a weight"):
            engine.update_weights_from_tensor([("model.layers.0.no_such.weight", torch.zeros(3, 3))])
        with pytest.raises(EngineError, match=r"down_proj.weight': shape \(3, 3\) != engine"):
            engine.update_weights_from_tensor([("model.layers.0.mlp.down_proj.weight", torch.zeros(3, 3))])
    finally:
        engine.end_weight_update()
    assert engine.health() and engine.checksums() == before and engine.weight_version == version
    # Through a sync: a plan that does not fit the engine fails before anything moves, the engine serves on.
    spec = _spec(engine)
    name = sorted(spec["tensors"])[3]
    spec["tensors"][name + ".renamed"] = spec["tensors"].pop(name)
    _train(trainer_box["t"], seed=11)
    with pytest.raises(SyncFailed, match="does not match the engine's model") as err:
        guard_for(engine).sync(trainer_box["t"], SyncConfig(transport="colocated", **FAST), spec)
    _assert_restored(err.value, engine, before, version)


@pytest.mark.parametrize("transport,point,nth", [("colocated", "sync.bucket", 3), ("per-tensor", "sync.version", 1)])
def test_exception_mid_sync_restores_the_old_weights(engine, trainer_box, transport, point, nth):
    err, before, v_before, _ = _fault_sync(trainer_box, engine, transport, point, "raise", nth)
    assert "injected fault" in str(err)
    _assert_restored(err, engine, before, v_before)
    _next_sync_lands(trainer_box, engine, transport)


def test_trainer_killed_mid_sync(engine, trainer_box):
    t0 = time.monotonic()
    err, before, v_before, seen = _fault_sync(trainer_box, engine, "colocated", "sync.bucket", "wait", 2,
                                              kill="trainer")
    assert seen == {"reached": True, "served_mid_sync": False}
    assert err.metrics["sync/trainer_alive"] is False and "start a new one" in str(err)
    # killed mid-way through the sync's one engine call (labkit.engine.inside.ring): the engine stays up, restored
    # in place
    assert err.metrics["sync/engine_restarted"] is False, err.metrics
    _assert_restored(err, engine, before, v_before)
    print(f"trainer killed: restored in {err.metrics['timing/sync/restore']:.2f} s ({time.monotonic() - t0:.1f} s)")
    _new_trainer(trainer_box)
    _next_sync_lands(trainer_box, engine)


def test_engine_killed_mid_sync_is_restarted_and_restored(engine, trainer_box):
    from tests.integration.conftest import live

    old_actor, info = engine._actor, engine._b.ready()
    err, before, v_before, seen = _fault_sync(trainer_box, engine, "distributed", "sync.bucket", "wait", 2,
                                              kill="engine")
    assert seen == {"reached": True, "served_mid_sync": False}
    assert err.metrics["sync/engine_restarted"] is True and engine._actor is not old_actor
    assert not live([info["pid"], *info["children"]]), "the killed engine's SGLang processes must be gone"
    _assert_restored(err, engine, before, v_before)
    print(f"engine killed: restarted + restored in {err.metrics['timing/sync/restore']:.1f} s")
    _next_sync_lands(trainer_box, engine, "distributed")


def test_an_engine_whose_scheduler_raises_says_what_it_raised(engine, trainer_box):
    """SGLang's scheduler raising inside an apply takes the engine actor down; the error says what it raised."""
    guard = guard_for(engine)
    _train(trainer_box["t"], seed=53)
    guard.sync(trainer_box["t"], SyncConfig(transport="colocated", **FAST), _spec(engine))  # a known last good copy
    _train(trainer_box["t"], seed=54)
    before, v_before = engine.checksums(), engine.weight_version
    fp.arm_in_actor(engine._actor, "engine.apply", "raise", 1, match=".k_proj.")
    with pytest.raises(SyncFailed) as err:
        guard.sync(trainer_box["t"], SyncConfig(transport="per-tensor", **FAST), _spec(engine))
    assert "SGLang said: labkit.failpoints.FaultInjected: injected fault at engine.apply" in str(err.value), err.value
    assert err.value.metrics["sync/engine_restarted"] is True
    _assert_restored(err.value, engine, before, v_before)


def test_hanging_broadcast_peer_is_bounded_by_the_deadline(engine, trainer_box):
    t0 = time.monotonic()
    err, before, v_before, _ = _fault_sync(trainer_box, engine, "distributed", "transport.send", "hang", 2,
                                           deadline_s=12.0, timeout_s=6.0)
    took = time.monotonic() - t0
    assert "deadline_s=12" in str(err) and err.metrics["sync/trainer_alive"] is False
    _assert_restored(err, engine, before, v_before)
    assert took < 12.0 + 60.0, f"a hung peer held the sync {took:.0f} s"
    _new_trainer(trainer_box)
    _next_sync_lands(trainer_box, engine, "distributed")


def test_port_in_use_is_retried(engine, trainer_box):
    _train(trainer_box["t"], seed=31)
    fp.arm_in_actor(trainer_box["t"].actors[0], "transport.open", "squat")
    m = guard_for(engine).sync(trainer_box["t"], SyncConfig(transport="distributed", **FAST), _spec(engine))
    fp.disarm_in_actor(trainer_box["t"].actors[0])
    assert m["sync/verified"] is True and m["sync/port_retries"] == 1


def test_engine_url_that_does_not_answer_fails_fast_naming_it():
    from labkit.cluster.runtime import free_port
    from labkit.engine import EngineConfig, EngineHandle, EngineUnreachable

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(EngineUnreachable, match=f"engine at {url} did not answer GET /health"):
        EngineHandle.start(EngineConfig(model_dir="/unused", url=url, call_timeout_s=3))
    assert time.monotonic() - t0 < 15


def test_labkit_faults_quick(capsys):
    import json

    from labkit.cli import main

    t0 = time.monotonic()
    rc = main(["faults", "--json", "--quick", "--seed", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(f"labkit faults --quick: {time.monotonic() - t0:.0f} s: {out}")
    for key in ("faults/trials", "faults/half_updated", "faults/recovered", "faults/kinds", "faults/per_kind",
                "faults/modified_then_restored", "faults/served_mid_sync", "faults/recover_s_max", "faults/wall_s"):
        assert key in out, key
    assert out["faults/trials"] == len(QUICK_KINDS) and set(out["faults/kinds"]) == set(QUICK_KINDS)
    assert out["faults/half_updated"] == 0 and out["faults/recovered"] == out["faults/trials"]
    # served_mid_sync == 0 means something only if probes ran while syncs were held mid-way
    assert out["faults/mid_sync_probes"] >= 3 and out["faults/served_mid_sync"] == 0
    assert rc == 0
