"""`labkit soak`'s settings: how long, which syncs and faults the seeded schedule draws, what is served meanwhile,
and the thresholds the run is judged by (issue: "soak"). Frozen and validated on construction, like every config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from labkit.config import _int, check, check_choice, number
from labkit.lab.soak.schedule import check_covered

# The transports several engines take at once (labkit.sync.fanout.Replicas): `direct` writes into one engine's
# own parameters and delta sync keeps one engine's copy, so Replicas refuses both (a ValueError naming them).
Transport = Literal["per-tensor", "colocated", "distributed"]
# The fault kinds of labkit.lab.faults.plan that reach a two-engine sync. `bad_tensor` needs a spec other than
# the engines' own, which Replicas reads itself: it is `labkit faults`'s alone.
Kind = Literal["exception", "trainer_killed", "trainer_killed_packing", "engine_killed", "apply_crash",
               "apply_hang", "corrupt_in_transit", "peer_hang", "peer_absent", "port_in_use"]


@dataclass(kw_only=True, slots=True, frozen=True)
class SoakConfig:
    """`labkit soak`: one trainer, two engines (an SGLang HTTP server under client load, and a Ray actor engine)
    synced together, for `minutes` of train step -> sync -> check."""

    minutes: float = 20.0
    """Minutes of the sync loop (engine start and the summary come on top)."""
    seed: int = 0
    """Seed of the schedule: each sync's transport and bucket size, each fault's kind and place."""
    fault_every: int = 9
    """Every this many syncs, one carries a fault."""
    kinds: tuple[Kind, ...] = ("exception", "trainer_killed", "trainer_killed_packing", "engine_killed",
                               "apply_crash", "apply_hang", "corrupt_in_transit", "peer_hang", "peer_absent",
                               "port_in_use")
    """Fault kinds drawn, in shuffled rounds (each equally often)."""
    transports: tuple[Transport, ...] = ("per-tensor", "colocated", "distributed")
    """Transports drawn for the syncs, in shuffled rounds."""
    bucket_mbs: tuple[float, ...] = (0.02, 0.05, 0.2, 1.0)
    """Bucket sizes drawn (MiB): from many buckets per sync of the tiny model to one."""
    pause_mode: Literal["abort", "retract"] = "retract"
    """How the served engine pauses for a sync: retract keeps every request (none is refused); abort refuses the
    running ones, and each refusal counts against the run (soak/refused)."""
    warmup: int = 50
    """Syncs before the leak and drift slopes start (first allocations, caches, Ray's worker pool)."""
    accept_every: int = 25
    """Every this many syncs, the served draft's acceptance on the held-out prompts (measured twice)."""
    clients: int = 2
    """labkit client threads streaming greedy requests to the HTTP engine (an OpenAI client thread besides)."""
    prompts: int = 8
    """Distinct prompts the labkit clients cycle through."""
    max_new_tokens: int = 8
    """ignore_eos: every labkit client response has this length."""
    lr: float = 1e-3
    """The trainer's. Large enough that syncs change the shipped model's greedy outputs (a mixed response is seen
    only where two versions answer differently: soak/versions_changing_greedy says how often they did)."""
    timeout_s: float = 10.0
    """Any single engine call or wait of a sync."""
    deadline_s: float = 20.0
    """A whole sync; finds a hung peer or engine."""
    rss_mb_per_100: float = 1.0
    """Target: resident memory of each process grows at most this many MB per 100 syncs after warm-up."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        check(number(self.minutes) and self.minutes > 0, "minutes", self.minutes, "a positive number")
        _int("seed", self.seed, 0)
        for f in ("fault_every", "accept_every", "clients", "prompts", "max_new_tokens"):
            _int(f, getattr(self, f))
        _int("warmup", self.warmup, 2)
        for f in ("lr", "timeout_s", "deadline_s", "rss_mb_per_100"):
            check(number(getattr(self, f)) and getattr(self, f) > 0, f, getattr(self, f), "a positive number")
        check_choice(self, "pause_mode")
        for f, allowed in (("kinds", Kind.__args__), ("transports", Transport.__args__)):
            v = getattr(self, f)
            check(isinstance(v, tuple) and len(v) > 0 and len(set(v)) == len(v) and set(v) <= set(allowed), f, v,
                  f"a non-empty tuple of distinct values of {', '.join(allowed)}")
        check_covered(self.kinds, self.transports)  # every kind must have a transport it can land on
        check(isinstance(self.bucket_mbs, tuple) and len(self.bucket_mbs) > 0
              and all(number(b) and b > 0 for b in self.bucket_mbs), "bucket_mbs", self.bucket_mbs,
              "a non-empty tuple of positive sizes in MiB")
