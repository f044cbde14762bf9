"""What one sync does: `SyncConfig`, frozen and validated on construction (torch-free, so a CLI or notebook can
check its flags before anything heavy is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from labkit.config import check, check_choice, number
from labkit.engine.config import PauseMode

MB = 1 << 20
TransportName = Literal["per-tensor", "colocated", "distributed", "direct"]  # SyncConfig.transport values
Verify = Literal["checksum", "full", "none"]
Selector = Literal["all", "target", "draft"]  # SGLang's weight selector
EngineLoader = Literal["auto", "labkit", "sglang"]
TRANSPORTS = get_args(TransportName)


@dataclass(kw_only=True, slots=True, frozen=True)
class SyncConfig:
    """One trainer -> engine weight sync (`stage_dir` is internal plumbing: leave it None)."""

    transport: TransportName = "colocated"
    """How weights travel: per-tensor (one call per tensor, the baseline), colocated (flattened buckets through
    shared memory), distributed (flattened buckets broadcast over a torch.distributed group), direct (the trainer
    writes into the engine's shared parameters: one copy; CPU engines at TP=1 with labkit's models)."""
    bucket_mb: float = 64.0
    """Flattened bucket size in MiB."""
    memory_budget_mb: float | None = None
    """Refuse buckets whose double-buffered footprint exceeds this many MiB (None: no budget)."""
    verify: Verify = "checksum"
    """checksum (cheap, default), full (element-wise) or none (refused by the atomic guard)."""
    selector: Selector = "all"
    """SGLang selector: target, draft or all (MTP draft weights ride along)."""
    overlap: bool = True
    """Pack the next bucket while the engine applies the current one."""
    progress: bool = True
    """Show a progress bar."""
    release_kv_cache: bool | None = None
    """None: on where CUDA is present (SGLang cannot release on CPU)."""
    atomic: bool = True
    """labkit.sync.sync(): land completely or restore the last good weights (labkit.sync.atomic)."""
    timeout_s: float = 120.0
    """The longest single wait: engine call, rendezvous, broadcast."""
    deadline_s: float = 600.0
    """The whole sync (atomic): a trainer still busy then is killed, the engine restored."""
    stage_dir: str | None = None
    """Internal: where the session writes a host copy of what it sends (set by labkit.sync.atomic)."""
    stage_spare: bool = True
    """Atomic syncs: keep the superseded rollback copy's files for the next sync to write over through mappings
    already faulted in (two models of host memory at rest); False frees it after each sync (one model at rest, and
    each sync's rollback copy faults a fresh model's worth of tmpfs pages in)."""
    unsafe_skip_verify: bool = False
    """Let the atomic guard serve (and keep as rollback) verify="none" weights."""
    delta: int = 0
    """0: every sync sends every byte. N >= 1: send only the words that changed since the engine's copy (a change
    mask + the changed words, into labkit's engine-side loader; colocated or distributed), with a full sync,
    the anchor, at least every N syncs (labkit.sync.delta). Pays off where the engine serves bf16."""
    host_threads: int | None = None
    """CPU syncs: torch's intra-op threads in the trainer while the buckets stream (None: every core but one, the
    engine's, which applies while the trainer packs; labkit.sync.bucket.host_threads). GPU syncs ignore it."""
    engine_loader: EngineLoader = "auto"
    """What applies a flattened bucket inside the engine (colocated, distributed). labkit: labkit's loader
    (labkit.engine.inside.apply: buffers kept mapped across syncs, a copy plan compiled once, a colocated sync in one
    engine call, buckets packed into the guard's staging file). sglang: SGLang's stock path, as verl (PR #2418) and
    slime run it: `update_weights_from_tensor(load_format="flattened_bucket")` one call per bucket, or
    `update_weights_from_distributed` with the bucket's HF names, each into the model's `load_weights` (`labkit
    bench sync` times it as its peer arms). auto: labkit on a CPU engine; on a GPU sglang, until labkit's path
    (measured by `labkit bench device`) has run against a real GPU engine."""
    pause_mode: PauseMode = "abort"
    """Atomic syncs: SGLang's pause mode (abort, retract; in_place is refused; labkit.lab.bench.serve)."""
    probe: int = 0
    """Behaviour check after each sync (labkit.sync.probe), 0: off. The engine samples `probe` tokens for each of a
    fixed batch of prompts and the trainer (a producer that scores tokens) scores the same tokens; `sync/probe_kl`
    (their KL estimate) above `probe_kl_max` fails the sync and, atomic, restores the last good weights. It catches what
    checksums cannot: stale derived weights, caches, an engine serving something other than what it holds."""
    probe_kl_max: float | None = None
    """The largest `sync/probe_kl` a sync may show. None: by the engine's precision (labkit.sync.probe.limit),
    1e-4 for a float32 engine, 0.25 for a bf16, fp16 or block-FP8 one, set from data/probe_calibration_cpu.json
    (a correct fp32 sync reads <= 1e-9, one training step stale >= 1e-3; a correct FP8 sync reads 0.05-0.08 on
    labkit's tiny FP8 preset, its quantization's own KL)."""

    def __post_init__(self) -> None:
        for f in ("transport", "verify", "selector", "pause_mode", "engine_loader"):
            check_choice(self, f)
        check(number(self.bucket_mb) and self.bucket_mb > 0, "bucket_mb", self.bucket_mb, "a positive number of MiB")
        if self.memory_budget_mb is not None:
            check(number(self.memory_budget_mb) and self.memory_budget_mb > 0, "memory_budget_mb",
                  self.memory_budget_mb, "a positive number of MiB or None")
            check(2 * self.bucket_mb <= self.memory_budget_mb, "bucket_mb", self.bucket_mb,
                  f"at most half the memory budget ({self.memory_budget_mb} MiB): two buckets are in flight")
        for f in ("atomic", "stage_spare", "unsafe_skip_verify"):
            check(isinstance(getattr(self, f), bool), f, getattr(self, f), "True or False")
        if self.atomic and self.verify == "none" and not self.unsafe_skip_verify:
            raise ValueError("verify='none' is refused by the atomic guard (atomic=True): it would serve, and keep as "
                             "the rollback target, weights nobody checked; pass unsafe_skip_verify=True to serve "
                             "unverified weights, or atomic=False to measure the bare transport")
        check(number(self.delta, int) and self.delta >= 0, "delta", self.delta,
              "0 (off) or the number of syncs between full anchors (>= 1)")
        if self.delta:
            check(self.transport in ("colocated", "distributed"), "transport", self.transport,
                  "colocated or distributed with delta (one flat bucket per call carries a delta)")
            check(self.engine_loader != "sglang", "engine_loader", self.engine_loader,
                  "auto or labkit with delta (only labkit's loader decodes a delta payload)")
        check(self.host_threads is None or (number(self.host_threads, int) and self.host_threads >= 1), "host_threads",
              self.host_threads, "None (every core but the engine's) or a positive number of threads")
        check(number(self.probe, int) and self.probe >= 0, "probe", self.probe,
              "0 (off) or the tokens to sample per probe prompt")
        check(self.probe_kl_max is None or (number(self.probe_kl_max) and self.probe_kl_max > 0), "probe_kl_max",
              self.probe_kl_max, "None (by the engine's precision) or a positive number")
        if self.atomic and self.pause_mode == "in_place":
            raise ValueError("pause_mode='in_place' is refused by the atomic guard (atomic=True): SGLang leaves "
                             "running requests in place with KV computed by the old weights, so their remaining "
                             "tokens would mix versions, and it refuses the prefix-cache flush a sync needs while "
                             "they run; use 'retract' (running requests are recomputed under the new weights) or "
                             "'abort', or atomic=False to measure the bare transport")
        for f in ("timeout_s", "deadline_s"):
            v = getattr(self, f)
            check(number(v) and v > 0, f, v, "a positive number of seconds")
        check(self.deadline_s >= self.timeout_s, "deadline_s", self.deadline_s,
              f"at least timeout_s={self.timeout_s}: the whole sync cannot be shorter than one of its waits")

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * MB))
