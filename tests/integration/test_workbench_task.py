"""Workbench(task=...) with the README's custom task on the real stack: the training step learns the task's
batch, `wb.sync(exclude=...)` reaches labkit.sync (the excluded tensors are reported unverified), and
`wb.rollout()` returns the engine's completions for the task's prompts, scored by the task's reward, with
data (samples) apart from metrics (scalars)."""

import math

import pytest

from labkit.sync import SyncConfig
from tests.integration.conftest import engine_config
from tests.unit.test_tasks import readme_task

pytestmark = pytest.mark.integration


def test_workbench_trains_syncs_and_rolls_out_a_custom_task(engine_model_dir):
    import ray

    from labkit.cluster import runtime
    from labkit.workbench import Rollout, Workbench

    started_ray = not ray.is_initialized()  # shut down only a Ray this test started (the session engine's stays)

    Reverse = readme_task()
    batches = []

    class Recording(Reverse):
        def batch(self, problems):
            batches.append(list(problems))
            return super().batch(problems)

    task = Recording()
    try:
        with Workbench(str(engine_model_dir), task=task, engine_cfg=engine_config(engine_model_dir)) as wb:
            hist = wb.train(1, batch_size=4, progress=False)
            assert len(batches) == 1 and all(p.prompt.endswith("|") for p in batches[0]) and len(batches[0]) == 4
            assert math.isfinite(hist[0]["train/loss"])
            m = wb.sync(SyncConfig(progress=False), exclude=(".mtp_layers.",))
            assert m["sync/verified"] is True and m["sync/num_unverified"] > 0
            assert all(".mtp_layers." in n for n in m["sync/unverified"])
            r = wb.rollout(n=6, temperature=1.0, seed=2)
            g = wb.compare_greedy(n_prompts=3)
    finally:
        if started_ray:
            runtime.shutdown()
    assert isinstance(r, Rollout) and len(r.samples) == 6
    assert [s["prompt"] for s in r.samples] == [p.prompt for p in task.problems(6, seed=2)]
    for s in r.samples:
        assert s["reward"] == task.reward(s["problem"], s["completion"])
        assert s["weight_version"] == m["sync/weight_version"] and len(s["logprobs"]) == len(s["tokens"]) > 0
    assert r.metrics == {"rollout/n": 6, "rollout/reward_mean": sum(s["reward"] for s in r.samples) / 6,
                         "rollout/weight_version": m["sync/weight_version"], "rollout/temperature": 1.0}
    assert all(not isinstance(v, (list, dict)) for v in {**r.metrics, **g.metrics}.values())
    assert g.metrics["rollout/greedy_match"] is True and [s["prompt"] for s in g.samples] == \
        [p.prompt for p in task.problems(3, seed=123)]
