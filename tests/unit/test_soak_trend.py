"""labkit.lab.soak.trend: the slope of a quantity over syncs with its 95 % interval, and the soak's no-upward-trend
verdict (the interval includes 0, or lies below rel x median per `per` syncs)."""

import random

import pytest

from labkit.lab.soak.trend import slope_ci95, trend


def test_a_known_line_is_recovered_exactly_and_two_points_claim_no_interval():
    assert slope_ci95([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0]) == (2.0, [2.0, 2.0])
    assert slope_ci95([0, 10], [5.0, 4.0]) == (-0.1, None)
    assert trend([0, 10], [5.0, 4.0])["upward"] is None  # nothing to judge a slope by


@pytest.mark.parametrize("n", [5, 300])
def test_the_interval_covers_the_true_slope_95_percent_of_the_time(n):
    rng, trials, covered = random.Random(n), 2000, 0
    for _ in range(trials):
        xs = list(range(n))
        _, (lo, hi) = slope_ci95(xs, [3.0 + 0.02 * x + rng.gauss(0, 1.0) for x in xs])
        covered += lo <= 0.02 <= hi
    assert 0.935 <= covered / trials <= 0.965, covered / trials


def test_the_verdict_passes_noise_and_tiny_drifts_and_fails_a_real_one():
    rng, xs = random.Random(0), list(range(300))
    flat = trend(xs, [1.0 + rng.gauss(0, 0.05) for _ in xs])
    assert flat["ci95_per"][0] <= 0 <= flat["ci95_per"][1] and flat["upward"] is False
    tiny = trend(xs, [1.0 + 2e-5 * x for x in xs])  # 0.2 % of the median per 100 syncs, measured exactly
    assert tiny["ci95_per"][0] > 0 and tiny["ci95_per"][1] < tiny["limit_per"] and tiny["upward"] is False
    real = trend(xs, [1.0 + 1e-3 * x + rng.gauss(0, 0.05) for x in xs])  # ~8 % per 100 syncs
    assert real["upward"] is True and real["slope_per"] == pytest.approx(0.1, abs=0.02)
    assert trend(xs, [1.0 - 1e-3 * x for x in xs])["upward"] is False  # falling is no upward trend
    assert not flat["inconclusive"] and not real["inconclusive"]
    short = trend(xs[:6], [1.0, 1.3, 0.8, 1.4, 0.9, 1.2])  # passes by the rule, but rules nothing out
    assert short["upward"] is False and short["inconclusive"] is True


def test_bad_input_names_what_was_given():
    with pytest.raises(ValueError, match="3 xs and 2 ys"):
        slope_ci95([0, 1, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="every x is 4"):
        slope_ci95([4, 4, 4], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="per=0 is invalid"):
        trend([0, 1, 2], [1.0, 2.0, 3.0], per=0)
    with pytest.raises(ValueError, match="rel=-0.1 is invalid"):
        trend([0, 1, 2], [1.0, 2.0, 3.0], rel=-0.1)
