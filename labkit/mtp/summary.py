"""The MTP experiment's JSON from its per-step rows: per seed, across seeds, and the checks that make the
comparison clean (held-out evaluation, identical rollouts, an engine draft that really stayed at step 0).

Pure Python over the rows `labkit.mtp.experiment.run_arm` writes ({"arm", "seed", "step", "mtp/...",
"train/...", "rollout/digest", "rl/eval_overlap", ...}).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from labkit.mtp import stats

CURVE_KEYS = {"accept_rate": "mtp/accept_rate", "accept_length": "mtp/accept_length", "reward": "train/reward",
              "accuracy": "train/accuracy", "offline_accept_rate": "mtp/offline_accept_rate"}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _num(v) -> bool:
    """A measured number: not None, not NaN (e.g. an offline estimate over a step with no drafted token)."""
    return isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))


def per_seed(rows: list[dict], arms: Sequence[str], seed: int) -> dict:
    """One seed's headline numbers: final and last-quarter acceptance per arm (one eval is noisy, +-0.04 on
    256 prompts: the last quarter's mean is steadier), the final acceptance by draft depth, reward and accuracy
    at the end."""
    out: dict = {"mtp/seed": seed}
    for a in arms:
        mine = [r for r in rows if r["arm"] == a]
        tail = mine[-max(1, len(mine) // 4):]
        out[f"mtp/final_accept_rate_{a}"] = mine[-1]["mtp/accept_rate"]
        out[f"mtp/final_accept_length_{a}"] = mine[-1]["mtp/accept_length"]
        out[f"mtp/final_reward_{a}"] = mine[-1]["train/reward"]
        out[f"mtp/final_accuracy_{a}"] = mine[-1]["train/accuracy"]
        out[f"mtp/tail_accept_rate_{a}"] = _mean([r["mtp/accept_rate"] for r in tail])
        if all("mtp/draft_sync_bytes" in r for r in mine):  # what the arm's cadence sent of the draft, all steps
            out[f"mtp/draft_sync_bytes_{a}"] = sum(r["mtp/draft_sync_bytes"] for r in mine)
        for key in (k for k in mine[-1] if k.startswith("mtp/accept_rate_pos_")):  # by draft depth (k > 1)
            out[f"mtp/final_{key.removeprefix('mtp/')}_{a}"] = mine[-1][key]
        for key in (k for k in mine[-1] if k.startswith(("mtp/accept_rate_at_", "mtp/loop_accept_rate_at_"))):
            out[f"mtp/final_{key.removeprefix('mtp/')}_{a}"] = mine[-1][key]  # by output position (bins)
        for key, name in (("mtp/loop_accept_rate", "mtp/final_loop_accept_rate"),
                          ("spec/speedup", "spec/final_speedup")):
            if key in mine[-1]:  # spec="engine": labkit's loop beside the engine's counters, and the draft's speed
                out[f"{name}_{a}"] = mine[-1][key]
    return out


def engine_checks(history: list[dict]) -> dict:
    """spec="engine": the greedy cross-check's worst step (overall and per depth), and whether every sync into the
    speculative engine that carried the draft was verified on its draft runner (how many did), which held what its
    store held at every step."""
    rows = [r for r in history if "mtp/engine_vs_loop_accept_diff" in r]
    if not rows:
        return {}
    out = {f"{k}_max": max((r[k] for r in rows if _num(r.get(k))), default=math.nan)
           for k in sorted({k for r in rows for k in r if k.startswith("mtp/engine_vs_loop_accept_diff")})}
    carried = [r["mtp/draft_verified"] for r in rows if r["mtp/draft_verified"] is not None]
    out["mtp/draft_verified_every_step"] = bool(carried) and all(carried)  # every sync that carried the draft
    out["mtp/draft_syncs_verified"] = len(carried)
    out["mtp/draft_runner_is_store_every_step"] = all(r["mtp/draft_runner_is_store"] for r in rows)
    return out


def curves(history: list[dict], arms: Sequence[str]) -> dict:
    """{arm: [{"step", <name>_mean, <name>_ci95 ([low, high] or None) for each CURVE_KEYS name}]}, over seeds."""
    out = {}
    for a in arms:
        steps = sorted({r["step"] for r in history if r["arm"] == a})
        points = []
        for s in steps:
            at = [r for r in history if r["arm"] == a and r["step"] == s]
            point: dict = {"step": s}
            for name, key in CURVE_KEYS.items():
                vals = [r[key] for r in at if _num(r.get(key))]
                mean, ci = stats.mean_ci95(vals) if vals else (None, None)
                point[name], point[f"{name}_ci95"] = mean, ci
            points.append(point)
        out[a] = points
    return out


def offline_error(history: list[dict], arms: Sequence[str]) -> dict:
    """|offline estimate - measured depth-1 acceptance| per step; mean and max, plus pooled. Only steps whose
    measured draft is the trainer's (not unsynced, not a stale draft between cadence syncs: the offline estimate
    reads the trainer's). The estimate comes from the RL step's rollouts (training prompts), the measurement
    from the held-out prompts: the error includes that shift of prompts, not only the estimator's."""
    rows = [r for r in history if r["arm"] in arms and r["arm"] != "unsynced"
            and r.get("mtp/engine_draft_is_trainers") is not False
            and _num(r.get("mtp/offline_accept_rate")) and _num(r.get("mtp/accept_rate_pos_1"))]
    if not rows:
        return {}
    errs = [abs(r["mtp/offline_accept_rate"] - r["mtp/accept_rate_pos_1"]) for r in rows]
    off, meas = _mean([r["mtp/offline_accept_rate"] for r in rows]), _mean([r["mtp/accept_rate_pos_1"] for r in rows])
    return {"mtp/offline_err_step_mean": _mean(errs), "mtp/offline_err_step_max": max(errs),
            "mtp/offline_accept_rate": off, "mtp/measured_accept_rate_pos_1": meas,
            "mtp/offline_vs_measured_rel_err": abs(off - meas) / max(meas, 1e-9)}


def rollouts_identical(history: list[dict], arms: Sequence[str], seeds: Sequence[int]) -> dict:
    """Do the arms of a seed see token-identical rollouts? At step 0 (equal weights) they must; later they do
    as long as the trunks stay equal (the draft cannot move the policy)."""
    if len(arms) < 2:  # one arm compares with nothing: no evidence either way
        return {"mtp/rollouts_identical_step0": None, "mtp/rollouts_identical_fraction": None}
    step0, later, total = [], 0, 0
    for seed in seeds:
        by_step: dict = {}
        for r in history:
            if r["seed"] == seed and r["arm"] in arms:
                by_step.setdefault(r["step"], set()).add(r.get("rollout/digest"))
        digests = by_step.get(0, set())
        step0.append(len(digests) == 1 and None not in digests)  # no digest is no evidence
        later += sum(len(d) == 1 and None not in d for s, d in by_step.items() if s > 0)
        total += sum(1 for s in by_step if s > 0)
    return {"mtp/rollouts_identical_step0": all(step0),
            "mtp/rollouts_identical_fraction": later / total if total else None}


def unsynced_engine_draft(history: list[dict]) -> dict:
    """The unsynced arm reads its draft back from the engine: equal to the trainer's at step 0 (one full sync),
    different afterwards (the trainer's draft trains, the engine's stays)."""
    rows = [r for r in history if r["arm"] == "unsynced" and "mtp/engine_draft_is_trainers" in r]
    if not rows:
        return {}
    return {"mtp/unsynced_engine_draft_step0_equal": all(r["mtp/engine_draft_is_trainers"] for r in rows
                                                         if r["step"] == 0),
            "mtp/unsynced_engine_draft_stale_after": all(not r["mtp/engine_draft_is_trainers"] for r in rows
                                                         if r["step"] > 0)}


def entropy_split(history: list[dict], arms: Sequence[str]) -> dict:
    """Per arm whose measured draft is the trainer's, the offline acceptance by target entropy pooled
    (count-weighted) over the last quarter of steps of every seed: {"mtp/offline_by_entropy_{arm}": {bin: [rate,
    count]}}."""
    out = {}
    for a in arms:  # not unsynced, nor stale steps: the offline estimate reads the trainer's draft, not theirs
        rows = [r for r in history if r["arm"] == a and a != "unsynced" and r.get("mtp/offline_by_entropy")
                and r.get("mtp/engine_draft_is_trainers") is not False]
        last = max((r["step"] for r in rows), default=0)
        tail = [r for r in rows if r["step"] > last - max(1, (last + 1) // 4)]
        pooled: dict = {}
        for r in tail:
            for name, (rate, count) in r["mtp/offline_by_entropy"].items():
                s, c = pooled.get(name, (0.0, 0))
                pooled[name] = (s + (rate or 0.0) * count, c + count)
        if pooled:
            out[f"mtp/offline_by_entropy_{a}"] = {n: [s / c if c else None, c] for n, (s, c) in pooled.items()}
    return out


def pre_rl(runs: list[dict], steps: int) -> dict:
    """The pre-RL draft phase over seeds (labkit.mtp.warmup): did the trunk stay the checkpoint's in every seed,
    did any warm-up step draw a held-out prompt, and the MTP loss at its first and last step (means)."""
    out: dict = {"mtp/pre_rl_steps": steps}
    if not runs:
        return out
    ms = [r["metrics"] for r in runs]
    firsts = [m["mtp/pre_rl_loss_first"] for m in ms if _num(m["mtp/pre_rl_loss_first"])]
    lasts = [m["mtp/pre_rl_loss_last"] for m in ms if _num(m["mtp/pre_rl_loss_last"])]
    out.update({"mtp/pre_rl_trunk_unchanged": all(m["mtp/pre_rl_trunk_unchanged"] for m in ms),
                "mtp/pre_rl_eval_overlap": sum(r.get("rl/eval_overlap", 0) for run in runs for r in run["rows"]),
                "mtp/pre_rl_loss_first": _mean(firsts) if firsts else None,
                "mtp/pre_rl_loss_last": _mean(lasts) if lasts else None})
    return out


def summarize(history: list[dict], arms: Sequence[str], seeds: Sequence[int], eval_held_out: bool) -> dict:
    """The JSON `labkit mtp-experiment` prints. `eval_held_out`: the eval problems are the task's held-out set
    and the checkpoint records it as excluded from pretraining; mtp/eval_disjoint adds that no RL step drew one."""
    seeds_rows = [per_seed([r for r in history if r["seed"] == s], arms, s) for s in seeds]
    out: dict = {"mtp/arms": curves(history, arms), "mtp/per_seed": seeds_rows}
    out.update(stats.across_seeds(seeds_rows, arms))
    for key in [k for k in seeds_rows[0] if k != "mtp/seed"]:  # the single-run keys, as means over seeds
        out[key] = _mean([s[key] for s in seeds_rows])
    first = [r for r in history if r["step"] == 0]
    out["mtp/start_accept_rate"] = _mean([r["mtp/accept_rate"] for r in first])
    out["mtp/start_reward"] = _mean([r["train/reward"] for r in first])
    out["mtp/eval_overlap_rl_prompts"] = sum(r.get("rl/eval_overlap", 0) for r in history)
    out["mtp/eval_disjoint"] = bool(eval_held_out) and out["mtp/eval_overlap_rl_prompts"] == 0
    out.update(offline_error(history, arms))
    out.update(rollouts_identical(history, arms, seeds))
    out.update(unsynced_engine_draft(history))
    out.update(entropy_split(history, arms))
    out.update(engine_checks(history))
    probed = [r["sync/probe_kl"] for r in history if "sync/probe_kl" in r]
    if probed:  # RLConfig.probe: the behaviour probe after every sync, its worst reading and how many there were
        out.update({"sync/probe_kl_max": max(probed), "sync/probe_syncs": len(probed)})
    return out
