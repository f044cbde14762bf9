"""labkit.lab.soak.schedule and SoakConfig: the seeded schedule of a long run (transports, bucket sizes, faults in
shuffled rounds, each fault on a transport its kind reaches), and the soak's settings refused by name."""

import itertools
from collections import Counter

import pytest

from labkit.lab.faults.plan import FAULTS
from labkit.lab.soak.config import SoakConfig
from labkit.lab.soak.schedule import steps


def _take(n, seed=0, **kw):
    cfg = SoakConfig(seed=seed, **kw)
    return list(itertools.islice(steps(cfg.seed, cfg.transports, cfg.bucket_mbs, cfg.kinds, cfg.fault_every), n))


@pytest.mark.parametrize("seed", range(20))
def test_every_fault_lands_on_a_transport_its_kind_reaches_and_rounds_cover_every_kind(seed):
    cfg, run = SoakConfig(), _take(400, seed)
    faults = [s.fault for s in run if s.fault]
    assert [s.index for s in run if s.fault] == list(range(cfg.fault_every - 1, 400, cfg.fault_every))
    for s in run:
        if s.fault:
            assert s.transport == s.fault.transport in FAULTS[s.fault.kind][2]
            assert s.fault.point is not None or s.fault.kind == "bad_tensor"
    # in rounds: after each full round of kinds, every kind has come up equally often
    n = len(cfg.kinds)
    for r in range(len(faults) // n):
        assert Counter(f.kind for f in faults[:(r + 1) * n]) == {k: r + 1 for k in cfg.kinds}


def test_the_schedule_is_its_seed_and_covers_every_transport_and_bucket_size_in_each_round():
    assert _take(100, 3) == _take(100, 3) and _take(100, 3) != _take(100, 4)
    clean = [s for s in _take(300, 1, fault_every=10**6)]
    cfg = SoakConfig()
    for r in range(0, 300, len(cfg.transports)):
        assert {s.transport for s in clean[r:r + len(cfg.transports)]} == set(cfg.transports)
    for r in range(0, 300, len(cfg.bucket_mbs)):
        assert {s.bucket_mb for s in clean[r:r + len(cfg.bucket_mbs)]} == set(cfg.bucket_mbs)


def test_a_kind_no_chosen_transport_reaches_is_refused_by_name():
    with pytest.raises(ValueError, match="peer_hang.*distributed"):
        SoakConfig(transports=("per-tensor",), kinds=("exception", "peer_hang"))


@pytest.mark.parametrize("field,value", [("minutes", 0), ("minutes", True), ("seed", -1), ("fault_every", 0),
                                         ("warmup", 1), ("kinds", ()), ("kinds", ("bad_tensor",)),
                                         ("transports", ("direct",)), ("transports", ("colocated", "colocated")),
                                         ("bucket_mbs", (0.0,)), ("pause_mode", "in_place"), ("clients", 0)])
def test_bad_settings_are_refused_naming_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=f"{field}=.*is invalid"):
        SoakConfig(**{field: value})
