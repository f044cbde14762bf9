"""One sync in flight (labkit.sync.session): its phase timings, the bucket still loading, the memory it added,
and the metrics it reports under stable keys (`timing/sync/<phase>`, `sync/...`: README *Metrics*)."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from labkit.sync import lastgood
from labkit.sync.config import SyncConfig
from labkit.sync.delta import DeltaState
from labkit.sync.memory import PeakRSS
from labkit.sync.plan import Bucket, Plan
from labkit.sync.transport import Transport

PHASES = ("gather", "quantize", "pack", "encode", "transfer", "load", "verify", "stage", "session", "setup")


@dataclass
class State:
    """One sync in flight: its phase timings, the bucket still loading, the memory it added."""

    cfg: SyncConfig
    t_start: float = field(default_factory=time.perf_counter)
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    plan: Plan | None = None
    transport: Transport | None = None
    delta: DeltaState | None = None  # cfg.delta: the copy of what the engine holds (labkit.sync.delta)
    unverified: list[str] | None = None
    device: str = "cpu"
    release: bool = False  # the KV cache is released while weights are in flight
    cold: bool = False  # planned or allocated buffers this time (a warm sync replays both)
    version: str = ""
    extra: int = 0  # the reusable flat buffers (or, per tensor, one cast copy in flight)
    peak: int = 0
    worker: ThreadPoolExecutor | None = None
    pending: Future | None = None  # the previous bucket's send, still loading
    pending_b: Bucket | None = None
    rss: PeakRSS | None = None  # resident memory over prepare + stream (labkit.sync.memory)
    held: list = field(default_factory=list)  # reusable buffer pools already resident when the sync began
    measured: int | None = None  # sync/peak_extra_bytes_measured
    nodes: dict = field(default_factory=dict)  # where trainer and engine run (labkit.sync.transport.where)
    stage: lastgood.Writer | None = None  # the rollback copy buckets are packed into (guarded, bucketed, CPU)

    def timed(self, phase: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.phases[phase] += time.perf_counter() - t0

    def collect(self) -> None:
        """Wait for the previous bucket to land; add the transport's own timings."""
        if self.pending is not None:
            for k, v in self.pending.result().items():
                self.phases[k] += v
            self.pending = None

    def note_peak(self, b: Bucket) -> None:
        """Oversize buckets travel alone in a buffer of their own, on top of the reusable ones."""
        in_flight = self.pending_b.nbytes if self.pending is not None and self.pending_b.oversize else 0
        self.peak = max(self.peak, self.extra + (b.nbytes if b.oversize else 0) + in_flight)


def coverage(unverified: list[str] | None) -> dict:
    """Engine tensors left unchanged on purpose (`exclude`); None without the engine's tensor list."""
    return {"sync/verified": None, "sync/unverified": None if unverified is None else unverified[:20],
            "sync/num_unverified": None if unverified is None else len(unverified)}


def metrics(s: State, result: dict) -> dict:
    """The sync's metrics: its phases, what it moved and how, and `result` (the hooks' and verification's)."""
    total, plan = time.perf_counter() - s.t_start, s.plan
    return {f"timing/sync/{k}": round(v, 6) for k, v in s.phases.items()} | {
        "timing/sync/total": round(total, 6),
        "sync/transport": s.cfg.transport,
        "sync/engine_loader": s.cfg.engine_loader,
        "sync/cold": s.cold,  # True: this sync's setup planned or allocated, a one-off an RL loop pays once
        "sync/bytes": plan.total_bytes,
        "sync/num_tensors": len(plan.tensors),
        "sync/num_buckets": len(plan.buckets),
        "sync/bucket_bytes": plan.bucket_bytes,
        "sync/gbps": round(plan.total_bytes / max(total - s.phases["verify"], 1e-9) / 1e9, 4),
        "sync/peak_extra_bytes": s.peak,
        "sync/peak_extra_bytes_measured": s.measured,
        "sync/largest_tensor_bytes": plan.largest_tensor_bytes,
        "sync/weight_version": s.version,
        "sync/port_retries": s.transport.port_retries,
        "sync/apply_path": getattr(s.transport, "apply_path", "load_weights"),  # labkit.engine.loader.apply_path
        **({"sync/direct_share": s.transport.share} if s.cfg.transport == "direct" else {}),
        **s.nodes,
        **(s.delta.metrics() if s.delta is not None else {"sync/wire_bytes": plan.total_bytes}),
        **result,
    }
