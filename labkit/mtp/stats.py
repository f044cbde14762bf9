"""Across-seed statistics for the MTP experiment: means with Student-t 95 % intervals, paired differences.

Pure Python. Few seeds (3 by default) make the normal 1.96 far too narrow (t_0.975 with 2 degrees of freedom
is 4.30), so the interval uses the exact t quantile for n - 1 degrees of freedom (`t975`). A paired difference
(trained minus frozen within each seed, same rollouts and eval prompts) removes the variation the arms share.
What the interval covers: the seeds' variation (trainer init, RL prompts, sampling), with one checkpoint and
one evaluation set held fixed; not the choice of either.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t975(df: int) -> float:
    """The exact 0.975 quantile of Student's t with `df` degrees of freedom, for any df: a table with a constant
    past its end gives intervals a little too narrow or too wide there."""
    if not (isinstance(df, int) and not isinstance(df, bool) and df >= 1):
        raise ValueError(f"df={df!r} is invalid: expected an integer >= 1")
    return _t975(df)


@functools.lru_cache(maxsize=256)
def _t975(df: int) -> float:
    """Bisection on the CDF to 1e-12."""
    lo, hi = 0.0, 20.0
    while t_cdf(hi, df) < 0.975:
        hi *= 2.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < 0.975 else (lo, mid)
    return (lo + hi) / 2.0


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
        if f"spec/final_speedup_{arm}" in per_seed[0]:  # spec="engine"
            mean, ci = mean_ci95([s[f"spec/final_speedup_{arm}"] for s in per_seed])
            out[f"spec/speedup_{arm}_mean"], out[f"spec/speedup_{arm}_ci95"] = mean, ci
    for key in (k for k in per_seed[0] if "accept_rate_at_" in k):  # by output position (labkit.mtp.positions)
        vals = [s[key] for s in per_seed if not math.isnan(s[key])]
        out[f"{key}_mean"], out[f"{key}_ci95"] = mean_ci95(vals) if vals else (math.nan, None)
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
