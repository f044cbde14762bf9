"""labkit.mtp.stats and labkit.mtp.summary: intervals that few seeds cannot overstate, paired differences, and
the checks that the arms differ only by design, on hand-made rows."""

import math
import random

import pytest

from labkit.mtp import stats, summary
from labkit.mtp.rl import RLConfig, sample_seed, sampling_params
from labkit.tasks import ArithTask, arith


def test_t_quantiles_are_exact_for_any_degrees_of_freedom():
    # published 0.975 quantiles (NIST/SEMATECH tables, scipy.stats.t.ppf to 10 digits)
    for df, q in ((1, 12.7062047362), (2, 4.30265272975), (3, 3.18244630528), (30, 2.04227245630),
                  (31, 2.03951344639), (120, 1.97993040508), (1000, 1.96233908082)):
        assert stats.t975(df) == pytest.approx(q, abs=1e-8), df
    assert stats.t_cdf(0.0, 7) == pytest.approx(0.5) and stats.t_cdf(-stats.t975(7), 7) == pytest.approx(0.025)
    with pytest.raises(ValueError, match="df=0"):
        stats.t975(0)


def test_three_seeds_use_t_not_normal():
    mean, (lo, hi) = stats.mean_ci95([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(4.30265272975 * 0.1 / math.sqrt(3))
    assert stats.mean_ci95([0.5]) == (0.5, None)  # one value claims no interval
    with pytest.raises(ValueError, match="no values"):
        stats.mean_ci95([])


@pytest.mark.parametrize("n", [3, 40])
def test_the_interval_covers_the_true_mean_95_percent_of_the_time(n):
    """Coverage over 4,000 simulated normal samples: a normal quantile at n = 3 covers ~0.86, a constant 2.0
    past 30 degrees of freedom ~0.95 only by luck of the constant; the exact t covers 0.95 at every n."""
    rng, trials = random.Random(n), 4000
    covered = 0
    for _ in range(trials):
        mean, (lo, hi) = stats.mean_ci95([rng.gauss(1.0, 2.0) for _ in range(n)])
        covered += lo <= 1.0 <= hi
    assert 0.94 <= covered / trials <= 0.96, covered / trials


def test_paired_difference_removes_what_the_arms_share():
    a, b = [0.9, 0.5, 0.7], [0.8, 0.4, 0.6]  # large seed-to-seed spread, constant difference
    mean, (lo, hi) = stats.paired(a, b)
    assert mean == pytest.approx(0.1) and hi - lo == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="one per seed"):
        stats.paired([1.0], [1.0, 2.0])


def _rows(seed, arm, rates, digest="d", overlap=0):
    return [{"arm": arm, "seed": seed, "step": i, "mtp/accept_rate": r, "mtp/accept_length": 1 + r,
             "train/reward": 0.7, "train/accuracy": 0.9, "mtp/offline_accept_rate": r + 0.01,
             "mtp/accept_rate_pos_1": r, "rollout/digest": f"{digest}{i}", "rl/eval_overlap": overlap,
             **({"mtp/engine_draft_is_trainers": i == 0} if arm == "unsynced" else {})}
            for i, r in enumerate(rates)]


ARMS = ("frozen", "trained", "unsynced")


def _history(overlap=0, differ_at=None):
    h = []
    for seed, bump in ((0, 0.0), (1, 0.05), (2, -0.03)):
        h += _rows(seed, "frozen", [0.7, 0.65 + bump, 0.6 + bump])
        h += _rows(seed, "trained", [0.7, 0.75 + bump, 0.8 + bump], overlap=overlap)
        h += _rows(seed, "unsynced", [0.7, 0.6 + bump, 0.55 + bump], digest="x" if differ_at == seed else "d")
    return h


def test_summary_keys_and_values():
    m = summary.summarize(_history(), ARMS, (0, 1, 2), eval_held_out=True)
    assert m["mtp/seeds"] == [0, 1, 2] and m["mtp/eval_disjoint"] is True
    assert m["mtp/diff_trained_frozen_mean"] == pytest.approx(0.2)
    lo, hi = m["mtp/diff_trained_frozen_ci95"]
    assert lo == pytest.approx(0.2) and hi == pytest.approx(0.2)
    assert m["mtp/final_accept_rate_trained_mean"] == pytest.approx((0.8 + 0.85 + 0.77) / 3)
    assert m["mtp/unsynced_lowest_all_seeds"] is True
    assert m["mtp/offline_err_step_mean"] == pytest.approx(0.01)
    assert m["mtp/offline_err_step_max"] == pytest.approx(0.01)
    assert m["mtp/rollouts_identical_step0"] is True and m["mtp/rollouts_identical_fraction"] == 1.0
    assert m["mtp/unsynced_engine_draft_step0_equal"] and m["mtp/unsynced_engine_draft_stale_after"]
    assert [p["step"] for p in m["mtp/arms"]["trained"]] == [0, 1, 2]


def test_overlap_or_a_checkpoint_without_held_out_is_not_disjoint():
    assert summary.summarize(_history(overlap=1), ARMS, (0, 1, 2), eval_held_out=True)["mtp/eval_disjoint"] is False
    assert summary.summarize(_history(), ARMS, (0, 1, 2), eval_held_out=False)["mtp/eval_disjoint"] is False


def test_missing_digests_or_nan_estimates_never_read_as_agreement():
    h = _history()
    for r in h:
        r.pop("rollout/digest")
    h[1]["mtp/offline_accept_rate"] = float("nan")
    m = summary.summarize(h, ARMS, (0, 1, 2), eval_held_out=True)
    assert m["mtp/rollouts_identical_step0"] is False
    assert math.isfinite(m["mtp/offline_err_step_mean"]) and math.isfinite(m["mtp/offline_err_step_max"])
    assert all(math.isfinite(p["offline_accept_rate"]) for p in m["mtp/arms"]["frozen"])


def test_stale_engine_drafts_are_left_out_of_the_offline_error():
    """With a cadence > 1 the trained arm's measurement reads the engine's stale draft while the offline estimate
    uses the trainer's: such steps are not the estimator's error."""
    h = _history()
    for r in h:
        if r["arm"] == "trained" and r["step"] == 1:
            r["mtp/engine_draft_is_trainers"] = False
            r["mtp/accept_rate_pos_1"] = 0.0
    assert summary.summarize(h, ARMS, (0, 1, 2), eval_held_out=True)["mtp/offline_err_step_max"] == pytest.approx(0.01)


def test_a_rollout_that_differs_between_arms_is_counted():
    m = summary.summarize(_history(differ_at=1), ARMS, (0, 1, 2), eval_held_out=True)
    assert m["mtp/rollouts_identical_step0"] is False and m["mtp/rollouts_identical_fraction"] == pytest.approx(2 / 3)


def test_sampling_seeds_are_per_prompt_sample_and_step():
    cfg = RLConfig(prompts=3, group=2)
    a, b = sampling_params(3, cfg, (0, 5)), sampling_params(3, cfg, (0, 5))
    assert a == b and len({p["sampling_seed"] for p in a}) == 6
    assert {p["sampling_seed"] for p in a}.isdisjoint(p["sampling_seed"] for p in sampling_params(3, cfg, (0, 6)))
    assert all("sampling_seed" not in p for p in sampling_params(3, cfg, None))
    assert 0 <= sample_seed(2**40, 7, 1) < 2**62 and sample_seed(1, 2) != sample_seed(2, 1)


def test_held_out_problems_never_appear_in_training_draws():
    task = ArithTask()
    held = {p.prompt for p in task.evaluation(256)}
    assert len(held) == 256
    commuted = {"+".join(reversed(p.rstrip("=").split("+"))) + "=" for p in held}
    assert commuted == held  # no held-out sum is trained as its commuted twin (b+a for a held-out a+b)
    rng = random.Random(0)
    for _ in range(20):
        assert held.isdisjoint(p.prompt for p in task.problems(512, seed=rng.randrange(10**9)))
    assert task.evaluation_digest() == arith.held_out_digest() != arith.held_out_digest(held_out=100)
    with pytest.raises(ValueError, match="n=257"):
        task.evaluation(257)
    with pytest.raises(ValueError, match="held_out=5000"):
        ArithTask(held_out=5000)


@pytest.mark.parametrize("seed", range(5))
def test_draft_objectives_are_distances_to_the_policy(seed):
    """labkit.trainer.mtp_loss.distance: KL and TV are >= 0 and 0 at q = p; TV matches 1 - sum min(p, q) (the
    acceptance it stands for); top-k soft CE is minimised by q = p's renormalised top-k; unknown kinds are named."""
    import torch

    from labkit.trainer.mtp_loss import TOPK, distance

    g = torch.Generator().manual_seed(seed)
    p, q = (torch.log_softmax(torch.randn(6, 32, generator=g), -1) for _ in range(2))
    for kind in ("policy", "tv"):
        assert (distance(p, q, kind) >= 0).all() and distance(p, p, kind).abs().max() < 1e-6
    assert torch.allclose(distance(p, q, "tv"), 1 - torch.minimum(p.exp(), q.exp()).sum(-1), atol=1e-6)
    top, idx = p.exp().topk(TOPK, -1)
    ideal = torch.full_like(p, -30.0).scatter(-1, idx, (top / top.sum(-1, keepdim=True)).log())
    assert (distance(p, ideal, "topk") <= distance(p, q, "topk") + 1e-6).all()
    ce = -(p.exp() * q).sum(-1)  # DSpark: 0.1 cross-entropy + 0.9 TV, smallest at q = p (where CE is p's entropy)
    assert torch.allclose(distance(p, q, "dspark"), 0.1 * ce + 0.9 * distance(p, q, "tv"), atol=1e-6)
    assert (distance(p, p, "dspark") <= distance(p, q, "dspark") + 1e-6).all()
    with pytest.raises(ValueError, match="kind='bogus'"):
        distance(p, q, "bogus")


def test_acceptance_by_entropy_splits_the_offline_estimate():
    """A confident target where the draft agrees and an uncertain one where it does not land in different bins,
    and the count-weighted pool of the bins is the plain offline estimate."""
    import torch

    from labkit.mtp.acceptance import by_entropy, offline_accept_rate

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, 16, generator=g)
    logits[:2] *= 20  # near one-hot targets: low entropy
    mtp = torch.cat([logits[:, 1:], logits[:, :1]], 1).clone()  # q at i = p at i+1: perfect on confident rows
    mtp[2:] = torch.randn(2, 7, 16, generator=g)
    mask = torch.ones(4, 7, dtype=torch.long)
    split = by_entropy(logits, mtp, mask, 1.0)
    assert sum(c for _, c in split.values()) == 4 * 5
    low = split["<0.05"]
    assert low[1] > 0 and low[0] > 0.9
    high = [v for k, v in split.items() if k.startswith(">=") and v[1]]
    assert high and high[0][0] < 0.9
    plain, n = offline_accept_rate(logits, mtp, mask, 1.0)
    pooled = sum((r or 0.0) * c for r, c in split.values()) / sum(c for _, c in split.values())
    assert n == 20 and pooled == pytest.approx(plain, abs=1e-6)


def test_one_arm_claims_nothing_about_identical_rollouts():
    h = [r for r in _history() if r["arm"] == "trained"]
    m = summary.summarize(h, ("trained",), (0, 1, 2), eval_held_out=True)
    assert m["mtp/rollouts_identical_step0"] is None and m["mtp/rollouts_identical_fraction"] is None
    assert "mtp/diff_trained_frozen_mean" not in m and "mtp/unsynced_lowest_all_seeds" not in m


def _pre_rl_run(unchanged: bool, overlap: int, first: float, last: float) -> dict:
    return {"rows": [{"rl/eval_overlap": overlap}], "metrics": {"mtp/pre_rl_trunk_unchanged": unchanged,
                                                                "mtp/pre_rl_loss_first": first,
                                                                "mtp/pre_rl_loss_last": last}}


def test_pre_rl_phase_summary_needs_every_seed_to_keep_its_trunk():
    assert summary.pre_rl([], 0) == {"mtp/pre_rl_steps": 0}  # no phase: nothing claimed
    ok = summary.pre_rl([_pre_rl_run(True, 0, 1.0, 0.5), _pre_rl_run(True, 0, 0.8, float("nan"))], 20)
    assert ok["mtp/pre_rl_trunk_unchanged"] is True and ok["mtp/pre_rl_eval_overlap"] == 0
    assert ok["mtp/pre_rl_loss_first"] == pytest.approx(0.9) and ok["mtp/pre_rl_loss_last"] == 0.5  # NaN left out
    bad = summary.pre_rl([_pre_rl_run(True, 0, 1.0, 0.5), _pre_rl_run(False, 2, 1.0, 0.5)], 20)
    assert bad["mtp/pre_rl_trunk_unchanged"] is False and bad["mtp/pre_rl_eval_overlap"] == 2


def test_pre_rl_steps_is_validated_with_the_draft_loss():
    from dataclasses import replace

    from labkit.mtp.experiment import ExperimentConfig

    with pytest.raises(ValueError, match="pre_rl_steps=-1"):
        ExperimentConfig(pre_rl_steps=-1)
    rl = RLConfig()
    no_draft_loss = replace(rl, train=replace(rl.train, mtp_loss_scale=0.0))
    with pytest.raises(ValueError, match="pre_rl_steps=5.*mtp_loss_scale is 0"):
        ExperimentConfig(pre_rl_steps=5, rl=no_draft_loss)
    assert ExperimentConfig(pre_rl_steps=5).pre_rl_steps == 5


def test_final_acceptance_is_kept_by_draft_depth():
    rows = [{"arm": "trained", "step": s, "mtp/accept_rate": 0.8, "mtp/accept_length": 2.0, "train/reward": 0.5,
             "train/accuracy": 0.5, "mtp/accept_rate_pos_1": 0.9 - s / 10, "mtp/accept_rate_pos_2": 0.6 - s / 10}
            for s in range(3)]
    out = summary.per_seed(rows, ["trained"], 0)
    assert out["mtp/final_accept_rate_pos_1_trained"] == pytest.approx(0.7)  # the last step's, per depth
    assert out["mtp/final_accept_rate_pos_2_trained"] == pytest.approx(0.4)


def test_acceptance_by_position_is_summarized_per_arm_with_intervals():
    rows = []
    for seed, drop in ((0, 0.10), (1, 0.20), (2, 0.30)):
        for arm in ("frozen", "trained"):
            for r in _rows(seed, arm, [0.7, 0.8]):
                r.update({"mtp/accept_rate_at_0_31": 0.9, "mtp/accept_rate_at_32_63": 0.9 - drop,
                          "mtp/loop_accept_rate_at_0_31": 0.95})
                rows.append(r)
    m = summary.summarize(rows, ("frozen", "trained"), (0, 1, 2), eval_held_out=True)
    assert m["mtp/per_seed"][1]["mtp/final_accept_rate_at_32_63_trained"] == pytest.approx(0.7)
    mean, (lo, hi) = m["mtp/final_accept_rate_at_32_63_frozen_mean"], m["mtp/final_accept_rate_at_32_63_frozen_ci95"]
    assert mean == pytest.approx(0.7) and lo < 0.6 and hi > 0.8
    assert m["mtp/final_accept_rate_at_0_31_trained_ci95"] == pytest.approx([0.9, 0.9])
    assert m["mtp/final_loop_accept_rate_at_0_31_frozen_mean"] == pytest.approx(0.95)
