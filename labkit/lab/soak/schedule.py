"""The soak's seeded schedule: what each sync of a long run is (transport, bucket size) and which carry a fault
(kind, failpoint, place). Pure, so a run can be replayed from its seed and the schedule property-tested.

Transports, bucket sizes and fault kinds come in shuffled rounds, not independent draws: every value has had its
turn after one round, so a short run covers them all as surely as a long one, and no stretch of the run is all one
transport (a drift in sync time would then be a transport's cost, not a trend). A fault's transport is one its kind
reaches (labkit.lab.faults.plan.FAULTS), taken in turns too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from labkit.lab.faults.plan import FAULTS, SYNC_POINTS, Trial


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    transport: str
    bucket_mb: float
    fault: Trial | None  # None: a clean sync


class _Rounds:
    """Values in shuffled rounds: each value once per round."""

    def __init__(self, values, rng: random.Random):
        self.values, self.rng, self.left = list(values), rng, []

    def next(self):
        if not self.left:
            self.left = self.rng.sample(self.values, len(self.values))
        return self.left.pop()


def reachable(kind: str, transports: tuple[str, ...]) -> tuple[str, ...]:
    """The transports of `transports` that fault `kind` can land on."""
    return tuple(t for t in FAULTS[kind][2] if t in transports)


def check_covered(kinds: tuple[str, ...], transports: tuple[str, ...]) -> None:
    """Every kind must reach one of the transports, or the schedule could never place it."""
    stuck = [k for k in kinds if not reachable(k, transports)]
    if stuck:
        raise ValueError(f"kinds={stuck!r} are invalid with transports={transports!r}: each reaches only "
                         + "; ".join(f"{k}: {', '.join(FAULTS[k][2])}" for k in stuck))


def steps(seed: int, transports: tuple[str, ...], bucket_mbs: tuple[float, ...], kinds: tuple[str, ...],
          fault_every: int) -> Iterator[Step]:
    """Sync after sync, without end (the run stops on time). Sync i carries a fault when (i + 1) % fault_every
    == 0; a fault that needs a transport (a rendezvous, a flattened bucket) takes one its kind reaches."""
    check_covered(kinds, transports)
    rng = random.Random(seed)
    tr, sizes, kind_rounds = _Rounds(transports, rng), _Rounds(bucket_mbs, rng), _Rounds(kinds, rng)
    turns = {k: _Rounds(reachable(k, transports), rng) for k in kinds}
    i = 0
    while True:
        transport, bucket_mb, fault = tr.next(), sizes.next(), None
        if (i + 1) % fault_every == 0:
            kind = kind_rounds.next()
            point, action, _ = FAULTS[kind]
            transport = turns[kind].next()
            if point is None and action is not None:  # a sync point (the broadcast too, where there is one)
                point = rng.choice(list(SYNC_POINTS) + (["transport.send"] if transport == "distributed" else []))
            fault = Trial(kind, transport, point, action, round(rng.random(), 3))
        yield Step(i, transport, bucket_mb, fault)
        i += 1
