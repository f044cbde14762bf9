"""labkit.mtp.cadence: every N-th step, or once the acceptance EMA fell a margin below its anchor; bad settings
named."""

import random

import pytest

from labkit.mtp.cadence import Cadence


def test_every_nth_step_carries_the_draft():
    c = Cadence(every=3)
    assert [c.carries(s, 0.5) for s in range(7)] == [False, False, True, False, False, True, False]
    assert Cadence().carries(0, 0.0) and not Cadence().stale_between and c.stale_between


def test_a_steady_draft_is_never_synced_and_a_decaying_one_is():
    steady = Cadence(margin=0.05)
    assert not any(steady.carries(s, 0.6) for s in range(50))
    decaying = Cadence(margin=0.05)
    carried = [s for s in range(30) if decaying.carries(s, 0.6 - 0.01 * s)]
    assert carried and carried[0] > 3  # a fall of 0.01 a step crosses 0.05 only after several steps


def test_after_a_draft_sync_the_next_measurement_anchors_again():
    c = Cadence(margin=0.1)
    assert [c.carries(s, a) for s, a in enumerate([0.8, 0.5, 0.3, 0.3])] == [False, True, False, False]


@pytest.mark.parametrize("seed", range(20))
def test_acceptance_that_never_falls_below_the_first_never_triggers(seed):
    rng = random.Random(seed)
    rates, margin = [rng.random() for _ in range(rng.randint(1, 60))], rng.uniform(0.01, 0.5)
    c = Cadence(margin=margin)
    assert not any(c.carries(s, max(r, rates[0])) for s, r in enumerate(rates))


@pytest.mark.parametrize("kw, match", [(dict(every=0), "draft_sync_every=0"), (dict(margin=1.0), "margin=1.0"),
                                       (dict(every=2, margin=0.1), "one cadence at a time")])
def test_bad_cadences_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        Cadence(**kw)
