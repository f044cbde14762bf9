"""labkit.mtp.positions: acceptance pooled into bins of output positions."""

import math

import pytest

from labkit.mtp import positions


def test_bins_pool_counts_not_rates():
    acc, prop = [0, 1, 9, 0, 2], [1, 1, 10, 0, 4]
    out = positions.binned(acc, prop, width=2)
    assert out == {"mtp/accept_rate_at_0_1": 0.5, "mtp/accept_rate_at_2_3": 0.9, "mtp/accept_rate_at_4_4": 0.5}
    assert positions.bin_keys(out) == list(out)


def test_an_empty_bin_is_nan_and_limit_cuts():
    out = positions.binned([1, 0, 0, 0], [1, 0, 0, 3], width=1, limit=3)
    assert out["mtp/accept_rate_at_0_0"] == 1.0 and math.isnan(out["mtp/accept_rate_at_1_1"])
    assert "mtp/accept_rate_at_3_3" not in out


def test_default_width_is_32_and_keys_sort_by_position():
    out = positions.binned([1] * 130, [2] * 130)
    assert positions.bin_keys(dict(reversed(out.items())))[:2] == ["mtp/accept_rate_at_0_31",
                                                                   "mtp/accept_rate_at_32_63"]
    assert list(out)[-1] == "mtp/accept_rate_at_128_129" and set(out.values()) == {0.5}


@pytest.mark.parametrize("acc, prop, needle", [([2], [1], "accepted_at[0]=2 is invalid"),
                                               ([1, 1], [1], "accepted_at=2 is invalid")])
def test_bad_counts_are_named(acc, prop, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        positions.binned(acc, prop)
