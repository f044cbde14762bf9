"""What one sync does: `SyncConfig`, frozen and validated on construction (torch-free, so a CLI or notebook can
check its flags before anything heavy is imported)."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import check
from labkit.engine.config import PAUSE_MODES

MB = 1 << 20
TRANSPORTS = ("per-tensor", "colocated", "distributed")


@dataclass(kw_only=True, slots=True, frozen=True)
class SyncConfig:
    transport: str = "colocated"
    bucket_mb: float = 64.0
    memory_budget_mb: float | None = None  # refuse buckets whose double-buffered footprint exceeds this
    verify: str = "checksum"  # "checksum" (cheap, default) | "full" (element-wise) | "none"
    selector: str = "all"  # SGLang selector: target, draft or all (MTP draft weights ride along)
    overlap: bool = True
    progress: bool = True
    release_kv_cache: bool | None = None  # None: on where CUDA is present (SGLang cannot release on CPU)
    atomic: bool = True  # labkit.sync.sync(): land completely or restore the last good weights (sync.atomic)
    timeout_s: float = 120.0  # the longest single wait: engine call, rendezvous, broadcast
    deadline_s: float = 600.0  # the whole sync (atomic): a trainer still busy then is killed, the engine restored
    stage_dir: str | None = None  # write a host copy of what is sent here (set by sync.atomic)
    unsafe_skip_verify: bool = False  # let the atomic guard serve (and keep as rollback) verify="none" weights
    pause_mode: str = "abort"  # atomic syncs: SGLang's pause mode (abort, retract, in_place; labkit.workbench.serve_sync)

    def __post_init__(self) -> None:
        check(self.transport in TRANSPORTS, "transport", self.transport, f"one of {', '.join(TRANSPORTS)}")
        check(isinstance(self.bucket_mb, (int, float)) and not isinstance(self.bucket_mb, bool) and self.bucket_mb > 0,
              "bucket_mb", self.bucket_mb, "a positive number of MiB")
        if self.memory_budget_mb is not None:
            check(isinstance(self.memory_budget_mb, (int, float)) and self.memory_budget_mb > 0,
                  "memory_budget_mb", self.memory_budget_mb, "a positive number of MiB or None")
            check(2 * self.bucket_mb <= self.memory_budget_mb, "bucket_mb", self.bucket_mb,
                  f"at most half the memory budget ({self.memory_budget_mb} MiB): two buckets are in flight")
        check(self.verify in ("checksum", "full", "none"), "verify", self.verify, "checksum, full or none")
        check(self.selector in ("all", "target", "draft"), "selector", self.selector, "all, target or draft")
        check(isinstance(self.atomic, bool), "atomic", self.atomic, "True or False")
        check(isinstance(self.unsafe_skip_verify, bool), "unsafe_skip_verify", self.unsafe_skip_verify,
              "True or False")
        if self.atomic and self.verify == "none" and not self.unsafe_skip_verify:
            raise ValueError("verify='none' is refused by the atomic guard (atomic=True): it would serve, and keep as "
                             "the rollback target, weights nobody checked; pass unsafe_skip_verify=True to serve "
                             "unverified weights, or atomic=False to measure the bare transport")
        check(self.pause_mode in PAUSE_MODES, "pause_mode", self.pause_mode, ", ".join(PAUSE_MODES))
        if self.atomic and self.pause_mode == "in_place":
            raise ValueError("pause_mode='in_place' is refused by the atomic guard (atomic=True): SGLang leaves "
                             "running requests in place with KV computed by the old weights, so their remaining "
                             "tokens would mix versions, and it refuses the prefix-cache flush a sync needs while "
                             "they run; use 'retract' (running requests are recomputed under the new weights) or "
                             "'abort', or atomic=False to measure the bare transport")
        for f in ("timeout_s", "deadline_s"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f, v,
                  "a positive number of seconds")
        check(self.deadline_s >= self.timeout_s, "deadline_s", self.deadline_s,
              f"at least timeout_s={self.timeout_s}: the whole sync cannot be shorter than one of its waits")

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * MB))
