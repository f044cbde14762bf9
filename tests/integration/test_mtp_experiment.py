"""`labkit mtp-experiment`: the whole loop (engine rollouts, GRPO + MTP loss in Megatron, sync, speculative
acceptance per step) on real components with --quick, acceptance measured by SGLang's own speculative decoding
(--spec engine) with labkit's loop beside it; the JSON contract is what is checked. The research
targets (trained >= frozen + 0.10, ...) are measured by the default run and recorded, never asserted here."""

import json
import math

import pytest

from tests.integration.test_bench_cli import _labkit

pytestmark = pytest.mark.integration

ARMS = ("frozen", "trained", "unsynced")


@pytest.fixture(scope="module")
def quick():
    rc, out, err = _labkit("mtp-experiment", "--quick", "--pre-rl-steps", "1", "--probe", "4", "--spec", "engine",
                           "--json", timeout=900)
    assert rc == 0, err[-3000:]
    return json.loads(out[-1])


def test_json_has_every_arm_and_headline_key(quick):
    assert set(quick["mtp/arms"]) == set(ARMS)
    for arm in ARMS:
        rows = quick["mtp/arms"][arm]
        assert [r["step"] for r in rows] == [0, 1, 2]
        for r in rows:
            assert {"step", "accept_length", "accept_rate", "reward"} <= set(r)
            # k = 1; SGLang counts the prefill token in completion_tokens, so a short answer can exceed k + 1
            assert 0.0 <= r["accept_rate"] <= 1.0 and 1.0 <= r["accept_length"] <= 3.0
        for k in ("final_accept_rate", "final_reward", "tail_accept_rate"):
            assert 0.0 <= quick[f"mtp/{k}_{arm}"] <= 1.0
    for k in ("mtp/start_accept_rate", "mtp/offline_vs_measured_rel_err"):
        assert math.isfinite(quick[k]) and quick[k] >= 0.0


def test_every_sync_of_the_rl_loop_passed_the_behaviour_probe(quick):
    # --probe 4: each step's sync is checked in behaviour (labkit.sync.probe); an fp32 engine and trainer agree to
    # rounding, and a sync whose probe failed would have stopped the run (the guard raises SyncFailed)
    assert quick["sync/probe_syncs"] == 3 * 2  # three arms, two training steps each
    assert 0.0 <= quick["sync/probe_kl_max"] < 1e-4


def test_every_arm_starts_from_the_same_measurement(quick):
    # Same checkpoint, same eval prompts, same sampling seed: step 0 is one number, whatever the arm.
    starts = {quick["mtp/arms"][a][0]["accept_rate"] for a in ARMS}
    assert len(starts) == 1 and starts.pop() == pytest.approx(quick["mtp/start_accept_rate"], abs=1e-12)


def test_the_arms_differ_only_by_design(quick):
    """Held-out evaluation, token-identical rollouts in every arm (sampling seeds; the draft cannot move the
    policy, so the trunks stay equal), and an unsynced draft read back from the engine that stayed at step 0."""
    assert quick["mtp/eval_disjoint"] is True and quick["mtp/eval_overlap_rl_prompts"] == 0
    assert quick["mtp/rollouts_identical_step0"] is True
    assert quick["mtp/rollouts_identical_fraction"] == 1.0
    assert quick["mtp/unsynced_engine_draft_step0_equal"] is True
    assert quick["mtp/unsynced_engine_draft_stale_after"] is True


def test_the_pre_rl_draft_phase_moves_only_the_draft(quick):
    """Every arm starts from a draft trained before RL (Bebop's cadence); the trunk stays the checkpoint's bit
    for bit, which the step-0 rollouts above (identical across arms) and this check both rely on."""
    assert quick["mtp/pre_rl_steps"] == 1 and quick["mtp/pre_rl_trunk_unchanged"] is True
    assert quick["mtp/pre_rl_eval_overlap"] == 0 and math.isfinite(quick["mtp/pre_rl_loss_last"])


def test_seed_keys_are_present_and_one_seed_claims_no_interval(quick):
    assert quick["mtp/seeds"] == [0] and len(quick["mtp/per_seed"]) == 1
    for arm in ARMS:
        assert quick[f"mtp/final_accept_rate_{arm}_mean"] == quick[f"mtp/final_accept_rate_{arm}"]
        assert quick[f"mtp/final_accept_rate_{arm}_ci95"] is None
    assert quick["mtp/diff_trained_frozen_ci95"] is None
    assert isinstance(quick["mtp/unsynced_lowest_all_seeds"], bool)
    assert 0.0 <= quick["mtp/offline_err_step_mean"] <= quick["mtp/offline_err_step_max"] <= 1.0


def test_the_engine_measures_what_labkits_loop_measures_on_the_draft_it_was_synced(quick):
    """SGLang's counters equal labkit's loop on SGLang's draft inputs at greedy, every step; every sync into the
    speculative engine was verified on its draft runner too; the draft's speed is reported per arm."""
    assert quick["mtp/spec"] == "engine"
    assert quick["mtp/engine_vs_loop_accept_diff_max"] <= 0.01
    assert quick["mtp/draft_verified_every_step"] is True and quick["mtp/draft_runner_is_store_every_step"] is True
    for arm in ARMS:
        assert 0.0 <= quick[f"mtp/final_loop_accept_rate_{arm}"] <= 1.0
        assert math.isfinite(quick[f"spec/speedup_{arm}_mean"]) and quick[f"spec/speedup_{arm}_mean"] > 0


@pytest.mark.parametrize("args,match", [
    (["--k", "0"], "k='0' is invalid"), (["--temperature", "-0.5"], "spec_temperature='-0.5' is invalid"),
    (["--arms", "trained,bogus"], "arms='trained,bogus'"), (["--group", "1"], "group='1' is invalid"),
    (["--steps", "0"], "steps='0' is invalid"), (["--seeds", "0,x"], "seeds='0,x' is invalid"),
    (["--seeds", "1,1"], "seeds='1,1' is invalid"), (["--eval-prompts", "300"], "n=300"),
    (["--pre-rl-steps", "-1"], "pre_rl_steps='-1' is invalid"), (["--spec", "gpu"], "spec='gpu' is invalid"),
])
def test_bad_flags_fail_before_anything_starts(args, match):
    rc, out, err = _labkit("mtp-experiment", "--quick", *args, timeout=60)
    assert rc != 0 and match in err, err[-2000:]
