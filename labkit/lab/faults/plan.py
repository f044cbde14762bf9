"""`labkit faults`: randomized fault injection at random points of real syncs (Megatron trainer -> SGLang).

Each trial trains one step (so the new version differs from the served one), records the engine's checksums
(old) and those of what the trainer is about to send (new), arms one fault (labkit.failpoints), runs an
atomic sync (labkit.sync.atomic) and then checks, before anything else talks to the engine, that it serves
exactly old or new (`half_updated` counts engines that serve neither), that its weight_version names what it
serves, what it served while the sync was held mid-way, whether the fault had really changed the engine's
weights before they were restored, and that a clean sync right after lands verified. The harness
(labkit.lab.faults.harness, which also has `run`) restarts whatever a fault killed; this module plans trials and
sums them up (pure).

Kinds, and where each one hits:

    exception               an exception in the trainer at a sync point (as a bug would)
    trainer_killed          the trainer killed at a sync point
    trainer_killed_packing  the trainer killed half-way through packing a bucket
    engine_killed           the engine killed between buckets
    apply_crash             the engine's scheduler dies inside an apply, between two of the copies a normal
                            sync makes: before the one that writes the nth fused group's k (the copies before
                            it have landed; q, k and v may be one merged copy), whole bucket or delta payload
    apply_hang              the engine's scheduler stops inside an apply (same place) and never answers
    corrupt_in_transit      one byte of a packed bucket flipped after packing, before it reaches the engine
    peer_hang               the trainer stops mid-broadcast (a stuck rendezvous peer)
    peer_absent             the engine never joins the rendezvous (a peer that never arrives)
    port_in_use             another program takes the rendezvous port first
    bad_tensor              the trainer's tensors no longer fit the engine's model (refused before sending)
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from labkit.config import ModelSpec, check

KINDS = ("exception", "trainer_killed", "trainer_killed_packing", "engine_killed", "apply_crash", "apply_hang",
         "corrupt_in_transit", "peer_hang", "peer_absent", "port_in_use", "bad_tensor")
# --quick (tests): the kinds that restart nothing.
QUICK_KINDS = ("exception", "corrupt_in_transit", "peer_absent", "port_in_use", "bad_tensor")
SYNC_POINTS = ("sync.begin", "sync.bucket", "sync.end", "sync.version")
FLATTENED = ("colocated", "distributed")
APPLIED = ("per-tensor", *FLATTENED)  # the transports whose buckets the engine applies (engine.apply)
# direct: the trainer writes into the engine's parameters itself (no bucket, no engine apply, no rendezvous), so
# the faults that reach it are the trainer's and the engine's own
WRITERS = (*APPLIED, "direct")
# faults that can land on a delta sync's payloads as well as on whole buckets: drawn on one in two of their
# flattened trials
DELTA_KINDS = ("exception", "apply_crash", "apply_hang", "corrupt_in_transit")
SPEC = ModelSpec(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seed=0)
# kind -> (failpoint, action, transports it applies to); None point: the fault is in the input
FAULTS = {
    "exception": (None, "raise", WRITERS),
    "trainer_killed": (None, "wait", WRITERS),
    "trainer_killed_packing": ("bucket.pack", "wait", FLATTENED),
    "engine_killed": (None, "wait", WRITERS),
    "apply_crash": ("engine.apply", "crash", APPLIED),
    "apply_hang": ("engine.apply", "hang", APPLIED),
    "corrupt_in_transit": ("transport.send", "corrupt", FLATTENED),
    "peer_hang": ("transport.send", "hang", ("distributed",)),
    "peer_absent": ("transport.peer", "skip", ("distributed",)),
    "port_in_use": ("transport.open", "squat", ("distributed",)),
    "bad_tensor": (None, None, WRITERS),
}


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultsConfig:
    """`labkit faults`: how many trials, and the sync settings each trial runs under."""

    trials: int = 33
    """Number of trials: three rounds of the eleven kinds."""
    seed: int = 0
    """Seed of the trial plan (kinds, points, transports)."""
    quick: bool = False
    """Only the faults that restart nothing (tests)."""
    bucket_mb: float = 0.05
    """Small buckets: many points inside one sync of the tiny model."""
    timeout_s: float = 6.0
    """Any single wait of a sync."""
    deadline_s: float = 15.0
    """A whole sync (the tiny model takes 1-5 s on 2 loaded cores); finds a hung peer."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        for f in ("trials", "seed"):
            v = getattr(self, f)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= (f == "trials"), f, v,
                  "an integer >= 1" if f == "trials" else "an integer >= 0")
        for f in ("bucket_mb", "timeout_s", "deadline_s"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f, v, "a positive number")


@dataclass(frozen=True, slots=True)
class Trial:
    kind: str
    transport: str
    point: str | None  # failpoint (None: the fault is in the input, not in a place)
    action: str | None
    frac: float  # where among the buckets / fused groups (resolved once the plan is known)
    delta: bool = False  # the faulted sync carries delta payloads (after an anchor sync: labkit.sync.delta)


def plan_trials(n: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[Trial]:
    """Kinds in shuffled rounds (every kind equally often), each with its own random point; a kind's transports
    are drawn without replacement until each has had a turn (three rounds put an exception on three of the four
    transports, not wherever chance falls)."""
    rng, out, turns = random.Random(seed), [], {}
    while len(out) < n:
        for kind in rng.sample(list(kinds), len(kinds)):
            point, action, transports = FAULTS[kind]
            turns[kind] = turns.get(kind) or rng.sample(list(transports), len(transports))
            transport = turns[kind].pop()
            if point is None and action is not None:  # a sync point (the broadcast too, where there is one)
                point = rng.choice(list(SYNC_POINTS) + (["transport.send"] if transport == "distributed" else []))
            delta = kind in DELTA_KINDS and transport in FLATTENED and rng.random() < 0.5
            out.append(Trial(kind, transport, point, action, round(rng.random(), 3), delta))
    return out[:n]


def half_updated(row: dict) -> bool:
    """The one definition: after the trial the engine holds neither the old weights nor the new ones, bitwise
    (serving or not: a dead engine holding a mix is restarted from the checkpoint, but it held a mix)."""
    return row["state"] == "neither"


def counted(row: dict) -> bool:
    """A trial counts as recovered only if its fault provably fired (`fired`, labkit.lab.faults.harness) and
    the engine then served old or new, named right, and took the next sync verified."""
    return bool(row["fired"]) and bool(row["recovered"])


def summarize(rows: list[dict], cfg: FaultsConfig, wall_s: float, restarts: dict) -> dict:
    per_kind = {}
    for k in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == k]
        per_kind[k] = {"trials": len(rs), "fired": sum(bool(r["fired"]) for r in rs),
                       "recovered": sum(counted(r) for r in rs), "half_updated": sum(half_updated(r) for r in rs),
                       "landed_new": sum(r["state"] == "new" for r in rs),
                       "kept_old": sum(r["state"] == "old" for r in rs),
                       "modified_then_restored": sum(r["modified_then_restored"] for r in rs),
                       "engine_restarted": sum(r["engine_restarted"] for r in rs),
                       "recover_s_max": round(max(r["recover_s"] for r in rs), 3)}
    rec = [r["recover_s"] for r in rows if r["restored"]]
    probes = [r["served_mid_sync"] for r in rows if r["served_mid_sync"] is not None]
    return {
        "faults/trials": len(rows),
        "faults/fired": sum(bool(r["fired"]) for r in rows),
        "faults/half_updated": sum(half_updated(r) for r in rows),
        "faults/not_serving": sum(not r["serving"] for r in rows),
        "faults/recovered": sum(counted(r) for r in rows),
        "faults/delta_trials": sum(bool(r.get("delta")) for r in rows),
        "faults/modified_then_restored": sum(r["modified_then_restored"] for r in rows),
        "faults/kinds": dict(Counter(r["kind"] for r in rows)),
        "faults/points": dict(Counter(r["point"] or "input" for r in rows)),
        "faults/transports": dict(Counter(r["transport"] for r in rows)),
        "faults/per_kind": per_kind,
        "faults/outcomes": dict(Counter(r["state"] for r in rows)),
        "faults/wrong_version": sum(not r["version_ok"] for r in rows),
        "faults/served_mid_sync": sum(bool(p) for p in probes),
        "faults/mid_sync_probes": len(probes),
        "faults/next_sync_verified": sum(r["next_sync_verified"] is True for r in rows),
        "faults/engine_restarts": restarts.get("engine", 0),
        "faults/trainer_restarts": restarts.get("trainer", 0),
        "faults/recover_s_mean": round(sum(rec) / len(rec), 3) if rec else 0.0,
        "faults/recover_s_max": round(max(rec), 3) if rec else 0.0,
        "faults/wall_s": round(wall_s, 1),
        "faults/seed": cfg.seed,
        "faults/rows": rows,
    }
