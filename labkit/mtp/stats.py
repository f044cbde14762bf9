"""Across-seed statistics for the MTP experiment: means with Student-t 95 % intervals, paired differences.

Pure Python. Few seeds (3 by default) make the normal 1.96 far too narrow (t_0.975 with 2 degrees of freedom
is 4.30), so the interval uses the t quantile for n - 1 degrees of freedom. A paired difference (trained -
frozen within each seed, same rollouts and eval prompts) removes the variation the arms share.
What the interval covers: the seeds' variation (trainer init, RL prompts, sampling), with one checkpoint and
one evaluation set held fixed; not the choice of either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Student-t 0.975 quantiles for 1..30 degrees of freedom (standard tables); beyond, 2.0 (t is 2.04 at 31 and 1.98
# at 120 degrees of freedom: a little wide rather than narrow).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if not (isinstance(df, int) and df >= 1):
        raise ValueError(f"df={df!r} is invalid: expected an integer >= 1")
    return _T975[df - 1] if df <= len(_T975) else 2.0


def mean_ci95(values: Sequence[float]) -> tuple[float, list[float] | None]:
    """(mean, [low, high]): the two-sided 95 % Student-t interval of the mean. One value supports no interval:
    None, never a zero-width one that would read as certainty."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("mean_ci95: no values: expected at least one")
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return mean, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    half = t975(len(xs) - 1) * sd / math.sqrt(len(xs))
    return mean, [mean - half, mean + half]


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, list[float] | None]:
    """mean_ci95 of a_i - b_i (equal lengths: one value per seed for each arm)."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values against {len(b)}: expected one per seed on each side")
    return mean_ci95([x - y for x, y in zip(a, b)])


def across_seeds(per_seed: Sequence[dict], arms: Sequence[str]) -> dict:
    """The issue's keys from one summary per seed (each with mtp/final_accept_rate_{arm}, mtp/tail_...):
    per arm mean and interval of final and last-quarter acceptance; trained - frozen paired; whether the
    unsynced arm is lowest in every seed."""
    out: dict = {"mtp/seeds": [s["mtp/seed"] for s in per_seed]}
    for arm in arms:
        for what in ("final", "tail"):
            mean, ci = mean_ci95([s[f"mtp/{what}_accept_rate_{arm}"] for s in per_seed])
            out[f"mtp/{what}_accept_rate_{arm}_mean"], out[f"mtp/{what}_accept_rate_{arm}_ci95"] = mean, ci
    if "trained" in arms and "frozen" in arms:
        for what in ("final", "tail"):
            key = "diff_trained_frozen" if what == "final" else "diff_trained_frozen_tail"
            mean, ci = paired([s[f"mtp/{what}_accept_rate_trained"] for s in per_seed],
                              [s[f"mtp/{what}_accept_rate_frozen"] for s in per_seed])
            out[f"mtp/{key}_mean"], out[f"mtp/{key}_ci95"] = mean, ci
    if "unsynced" in arms and len(arms) > 1:
        out["mtp/unsynced_lowest_all_seeds"] = all(
            s["mtp/final_accept_rate_unsynced"] < min(s[f"mtp/final_accept_rate_{a}"] for a in arms if a != "unsynced")
            for s in per_seed)
    return out
