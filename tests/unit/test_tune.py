import math
import random

import pytest

from labkit.sync.tune import MB, autotune, candidates, sweep


def _u_curve(opt_mb: float, noise: float, rng: random.Random):
    def measure(size: int) -> dict:
        x = math.log2(size / (opt_mb * MB))
        return {"seconds": 1.0 + 0.08 * x * x + noise * rng.random(), "peak_extra_bytes": 2 * size}
    return measure


@pytest.mark.parametrize("opt_mb", [1, 3, 16, 100, 700])
def test_autotune_reaches_within_10pct_of_sweep_best_in_6_trials(opt_mb):
    rng = random.Random(opt_mb)
    sizes = candidates(1 * MB, 1024 * MB)
    measure = _u_curve(opt_mb, 0.01, rng)
    curve = sweep(measure, sizes, progress=False)
    best = min(c["seconds"] for c in curve)
    r = autotune(measure, sizes, max_trials=6)
    assert len(r["trials"]) <= 6
    assert r["best_seconds"] <= 1.10 * best


def test_candidates_respect_budget_and_reject_bad_ranges():
    sizes = candidates(MB, 64 * MB, budget_bytes=32 * MB)
    assert sizes == [MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB]
    with pytest.raises(ValueError, match="admits no bucket"):
        candidates(64 * MB, 128 * MB, budget_bytes=MB)
    with pytest.raises(ValueError, match="lo_bytes=0"):
        candidates(0, MB)
