"""Whether a quantity drifts over a long run: its least-squares slope per sync with a 95 % interval, and the verdict.

The failures of long RL runs show as slopes, not as single bad samples: refit time that grows every step (NeMo-RL
#3166), pause time that comes to dominate the sync (marin #8955), resident memory that grows by a little per sync.
A few hundred noisy samples give a slope and an interval around it (Student t, n - 2 degrees of freedom), so "no
upward trend" is a statement with its own uncertainty: the interval includes 0, or all of it lies below a drift too
small to matter (`rel` of the median per `per` syncs). Pure Python, like labkit.mtp.stats.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from labkit.config import check
from labkit.mtp.stats import t975


def slope_ci95(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, list[float] | None]:
    """(slope, [low, high]): the ordinary least-squares slope of ys on xs and its two-sided 95 % interval. Two
    points fix a line and leave nothing to judge it by: None, never a zero-width interval."""
    x, y = [float(v) for v in xs], [float(v) for v in ys]
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"slope_ci95: {len(x)} xs and {len(y)} ys: expected two or more of each, as many xs as ys")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((v - mx) ** 2 for v in x)
    if sxx == 0:
        raise ValueError(f"slope_ci95: every x is {x[0]!r}: a slope needs two different xs")
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    if len(x) == 2:
        return slope, None
    resid = sum((b - (my + slope * (a - mx))) ** 2 for a, b in zip(x, y))
    half = t975(len(x) - 2) * math.sqrt(resid / (len(x) - 2) / sxx)
    return slope, [slope - half, slope + half]


def trend(xs: Sequence[float], ys: Sequence[float], per: int = 100, rel: float = 0.01) -> dict:
    """The drift of ys over xs (syncs), per `per` syncs, and whether it passes: `upward` False when the slope's
    interval includes 0 or its upper end is below `rel` x |median| per `per` syncs; None when there is no interval.
    `inconclusive`: the interval holds 0 but also reaches past that limit, so the run passes without having ruled a
    drift that matters out (too short or too noisy a run): say so beside the verdict, do not read it as clean."""
    check(isinstance(per, int) and not isinstance(per, bool) and per >= 1, "per", per, "an integer >= 1")
    check(isinstance(rel, (int, float)) and not isinstance(rel, bool) and rel > 0, "rel", rel, "a positive number")
    slope, ci = slope_ci95(xs, ys)
    median = statistics.median(float(v) for v in ys)
    limit = rel * abs(median) / per  # the slope, per sync, below which a drift is too small to matter
    upward = None if ci is None else not (ci[0] <= 0.0 <= ci[1] or ci[1] < limit)
    return {"per": per, "slope_per": slope * per, "ci95_per": None if ci is None else [v * per for v in ci],
            "median": median, "limit_per": limit * per, "upward": upward,
            "inconclusive": None if ci is None else ci[0] <= 0.0 <= ci[1] and ci[1] >= limit}
