"""One trainer, two engines, one weight version (labkit.sync.fanout): each bucket broadcast once into one
weight-update group of both engines, both verified; an engine that dies mid-sync is fenced and the other one
still lands the version."""

import pytest

from labkit import failpoints as fpt
from labkit.config import ParallelSpec, TrainConfig
from labkit.sync import SyncConfig
from labkit.sync.fanout import Replicas
from tests.integration.conftest import engine_config, restore_model_dir

pytestmark = pytest.mark.integration

CFG = dict(transport="distributed", bucket_mb=0.5, progress=False, timeout_s=30.0)


@pytest.fixture(scope="module")
def pair(engine, engine_model_dir):
    """The session's engine and a second one from the same model dir; the trainer; the shared engine gets the
    model dir's weights back afterwards."""
    from labkit.engine import EngineHandle
    from labkit.trainer.group import Trainer

    second = EngineHandle.start(engine_config(engine_model_dir))
    trainer = Trainer(str(engine_model_dir), ParallelSpec(), TrainConfig(lr=3e-3))
    reps = Replicas([engine, second])
    try:
        yield trainer, reps
    finally:
        reps.close()
        trainer.shutdown()
        second.shutdown()
        restore_model_dir(engine, engine_model_dir)


def _step(trainer, seed):
    from labkit.tasks import ArithTask

    task = ArithTask()
    trainer.train_step(*task.batch(task.problems(8, seed=seed)))


def test_two_engines_take_one_version_from_one_broadcast_and_both_verify(pair):
    trainer, reps = pair
    _step(trainer, 1)
    m = reps.sync(trainer, SyncConfig(**CFG), weight_version="r1")
    assert m["sync/verified"] is True and m["sync/num_buckets"] > 1, m
    assert m["sync/engines_synced"] == [0, 1] and m["sync/engines_fenced"] == [] and m["sync/attempts"] == 1
    assert m["sync/engine/0/verified"] is True and m["sync/engine/1/verified"] is True
    assert m["timing/sync/engine/0/calls"] > 0 and m["timing/sync/engine/1/calls"] > 0
    assert [e.weight_version for e in reps.engines] == ["r1", "r1"]
    a, b = (e.checksums() for e in reps.engines)
    assert a == b


def test_an_engine_that_dies_mid_sync_is_fenced_and_the_other_lands_the_version(pair):
    trainer, reps = pair
    _step(trainer, 2)
    dead = reps.engines[1]
    fpt.arm_in_actor(dead._actor, "engine.apply", "crash", 2, match=".k_proj.")  # its scheduler exits mid-sync
    m = reps.sync(trainer, SyncConfig(**CFG), weight_version="r2")
    assert m["sync/engines_synced"] == [0] and m["sync/engines_fenced"] == [1] and m["sync/attempts"] == 2, m
    assert m["sync/verified"] is True and m["sync/engine/0/verified"] is True and len(m["sync/errors"]) == 1
    live = reps.engines[0]
    assert live.weight_version == "r2"
    out = live.generate(prompts=["12+34="], sampling={"temperature": 0.0, "max_new_tokens": 3})
    assert out[0]["meta_info"]["weight_version"] == "r2"  # serving again, the new version
    _step(trainer, 3)  # the next version goes to the live engine alone, with no traffic to the fenced one
    m = reps.sync(trainer, SyncConfig(**CFG), weight_version="r3")
    assert m["sync/engines_synced"] == [0] and m["sync/attempts"] == 1 and "timing/sync/engine/1/calls" not in m
