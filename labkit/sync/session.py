"""One sync = one SGLang weight-update session, measured phase by phase.

prepare (plan or replay it, coverage check, buffers, transport) -> open the session (release the KV cache,
begin_weight_update) -> stream the buckets: gather (pull from the trainer's export) -> pack (flat buffer) -> transfer +
load (transport; overlapped with packing the next bucket) -> close the session (end_weight_update, flush_cache, resume
memory, new weight_version) -> verify (checksums, trainer side vs engine side) -> metrics.

Runs on the trainer rank that holds the full exported tensors (rank 0); the other ranks only drain the export generator,
whose collectives need every rank. What happens to each bucket besides sending it is a hook (labkit.sync.hooks): the
expected checksums, and with `stage_dir` set (labkit.sync.atomic does) the host-side copy of every tensor sent
(`timing/sync/stage`), the rollback source of the next sync. Every wait is bounded by `timeout_s`; named failpoints
(labkit.failpoints) mark where `labkit faults` injects faults.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch
from tqdm.auto import tqdm

from labkit import failpoints as fp
from labkit.sync import bucket as bk
from labkit.sync import hooks as hk
from labkit.sync import inflight
from labkit.sync import quantize
from labkit.sync.config import SyncConfig
from labkit.sync.delta import DeltaState
from labkit.sync.memory import PeakRSS, extra_at_peak
from labkit.sync.plan import Bucket, Plan, check_coverage, excluding, make_plan, metas_of
from labkit.sync.slots import Slots
from labkit.sync.transport import Mappings, make, where


MAX_PLANS = 4  # plans a Syncer keeps (each a few tensors' metadata; buffers are not kept per plan)


class Syncer:
    """Holds the replayed plan and the reusable buffers of one trainer rank across syncs."""

    def __init__(self):
        self.plan: Plan | None = None  # the last sync's plan
        # (bucket bytes, engine dtype, quantized) -> plan, most recently used last: a trainer alternating transports
        # or bucket sizes (a bench's arms, a tuner's trials) replays each plan instead of listing the export again
        self.plans: dict[tuple, Plan] = {}
        self.pool: bk.BufferPool | None = None
        self.delta: DeltaState | None = None
        self.maps = Mappings()  # transport="direct": the engine's parameter files, mapped once (none until then)
        self.slots = Slots()  # the atomic guard's rollback copies this rank writes, mapped once
        self.version = 0

    def close(self) -> None:
        """Free the reusable buffers now (shared-memory files for the colocated transport), not at exit."""
        for held in (self.pool, self.delta, self.maps, self.slots):
            if held is not None:
                held.close()
        self.pool = self.delta = None

    def run(self, named_iter, engine, cfg: SyncConfig, engine_spec: dict | None = None,
            weight_version: str | None = None, exclude: tuple[str, ...] = ()) -> dict:
        """prepare -> open the session -> stream the buckets -> close the session -> hooks' results -> metrics.
        `exclude`: name substrings left out on purpose (they stay unchanged and are reported unverified)."""
        s = inflight.State(cfg, held=self._pools())
        s.rss = PeakRSS().start()  # the kernel's high-water mark from here on: what the plan cannot count
        named_iter = self._prepare(s, named_iter, engine, engine_spec, tuple(exclude))  # plan, buffers, transport
        s.version = weight_version or f"v{self.version + 1}"
        s.timed("session", self._open_session, s, engine)  # release the KV cache, begin_weight_update
        hooks = hk.for_config(cfg, s.plan, engine_spec, self.slots)  # checksums or full copies; rollback copy
        try:
            with bk.host_threads(s.device, cfg.host_threads, s.nodes.get("sync/cross_node", False)):
                self._stream(s, iter(named_iter), engine, hooks)  # gather, pack, send (overlapped), hooks
            s.measured = extra_at_peak(s.rss, s.held, self._pools(), s.device)
        except BaseException:
            _abort(s, engine, hooks)  # best effort, never masking the original error
            if s.delta is not None:
                s.delta.drop()  # the engine may hold anything now: the next sync is an anchor
            raise
        s.timed("session", self._close_session, s, engine)  # end_weight_update, flush_cache, resume memory, version
        self.version += 1
        result = inflight.coverage(s.unverified)
        for h in hooks:  # verification, then the rollback copy made complete
            result.update(s.timed(h.phase, h.finish, engine, s.version))
        if s.delta is not None:  # a sync that did not verify leaves nothing to compute a delta against
            s.delta.drop() if result.get("sync/verified") is False else \
                s.delta.commit(s.version, getattr(s.transport, "apply_path", "load_weights"))
        fanout = engine.fanout_metrics() if hasattr(type(engine), "fanout_metrics") else {}
        return inflight.metrics(s, result) | fanout

    def _pools(self) -> list:
        return [p for p in (self.pool, self.delta and self.delta.pool) if p is not None]

    # --- prepare --------------------------------------------------------------------------------------------
    def _prepare(self, s: inflight.State, named_iter, engine, engine_spec: dict | None, exclude: tuple[str, ...]):
        """Plan (or replay the plan), refuse a sync that would not cover the engine, size the buffers, decide
        full or delta, make the transport."""
        cfg, excluded = s.cfg, []
        named_iter = excluding(named_iter, exclude, excluded) if exclude else named_iter
        if engine_spec and engine_spec.get("quant"):  # a block-FP8 engine: its fp8 weights quantized here
            named_iter = quantize.on_the_way(named_iter, engine_spec["tensors"], engine_spec["quant"], s.phases)
        bucket_bytes = 1 if cfg.transport == "per-tensor" else cfg.bucket_bytes
        # One trainer may sync engines serving different dtypes: a plan is replayed for the same bucket size
        # and engine dtype only (a bf16 engine refused an fp32 plan replayed from an fp32 engine's syncs).
        key = (bucket_bytes, engine_spec and engine_spec.get("dtype"), bool(engine_spec and engine_spec.get("quant")))
        replan = key not in self.plans
        if replan:
            named_iter = list(named_iter)  # first sync: learn the tensor list, then replay the plan
            s.phases["gather"] += time.perf_counter() - s.t_start
        t_setup = time.perf_counter()  # plan, validation, buffers, transport: paid in full on a first sync
        if replan:
            self.plans[key] = make_plan(metas_of(named_iter), cfg, key[1], engine_spec and engine_spec["tensors"])
            while len(self.plans) > MAX_PLANS:
                self.plans.pop(next(iter(self.plans)))
        self.plans[key] = self.plan = self.plans.pop(key)  # most recently used last
        s.plan, s.cold = self.plan, replan
        try:  # before the first byte moves
            s.unverified = check_coverage(s.plan, None if engine_spec is None else engine_spec["tensors"], exclude,
                                          len(excluded))
        except ValueError:
            self.plans.pop(key, None)  # a bad plan is not replayed: the next sync lists the export again
            self.plan = None
            raise
        self._buffers(s)
        if cfg.delta:
            self.delta = self.delta or DeltaState(cfg.delta, device=s.device)
            self.delta.anchor_every, s.delta = cfg.delta, self.delta
            s.delta.begin(s.plan, engine.weight_version)
            s.extra = s.peak = s.extra + (s.delta.pool.allocated_bytes if s.delta.pool else 0)
        elif self.delta is not None:  # delta off: its copy of the engine is host memory for nothing
            self.delta.close()
            self.delta = None
        s.transport = make(cfg.transport, timeout_s=cfg.timeout_s, delta=s.delta, maps=self.maps,
                           engine_loader=cfg.engine_loader)
        s.nodes = where(s.transport, engine)  # a handle-passing transport across nodes is refused here
        s.release = torch.cuda.is_available() if cfg.release_kv_cache is None else cfg.release_kv_cache
        s.phases["setup"] += time.perf_counter() - t_setup
        return named_iter

    def _buffers(self, s: inflight.State) -> None:
        s.device = "cuda" if torch.cuda.is_available() else "cpu"
        if s.device == "cpu":
            # Handles to CPU tensors must name shm files: the default fd strategy's handshake is refused
            # across unrelated processes and kills SGLang's scheduler (AuthenticationError).
            torch.multiprocessing.set_sharing_strategy("file_system")
        normal = max((b.nbytes for b in s.plan.buckets if not b.oversize), default=1)
        flat = s.cfg.transport not in ("per-tensor", "direct")
        if flat and (self.pool is None or self.pool.nbytes != normal):  # sized to the plan: no larger pool kept
            if self.pool is not None:
                self.pool.close()
            self.pool = bk.BufferPool(normal, device=s.device, shared=s.cfg.transport == "colocated")
            s.cold = True
        # Memory the sync adds: the reusable flat buffers (or, per tensor and direct, one cast copy in flight).
        s.extra = s.peak = self.pool.allocated_bytes if flat else s.plan.largest_tensor_bytes

    # --- the session ----------------------------------------------------------------------------------------
    @staticmethod
    def _open_session(s: inflight.State, engine) -> None:
        if s.release:  # free the KV cache while weights are in flight (slime/verl choreography)
            engine.release_memory(["kv_cache"])
        engine.begin_weight_update(selector=s.cfg.selector)

    def _stream(self, s: inflight.State, it, engine, hooks: list[hk.Hook]) -> None:
        """Every bucket: gather, pack, hand to the transport (on a worker thread, so the next bucket packs
        while this one loads, where `plan.overlaps` allows), then the hooks."""
        cfg, plan = s.cfg, s.plan
        s.worker = ThreadPoolExecutor(1, thread_name_prefix="labkit-sync")
        fp.hit("sync.begin")
        s.timed("setup", s.transport.open, engine, plan)
        if getattr(s.transport, "packs_into_stage", False) and s.device == "cpu":  # pack into the rollback copy:
            s.stage = s.transport.files = hk.stage_writer(hooks)  # the buckets are sent from there
        seen: set[str] = set()
        for b in tqdm(plan.buckets, desc=f"sync[{cfg.transport}]", unit="bucket", disable=not cfg.progress,
                      mininterval=1.0):
            if s.pending is not None and not (cfg.overlap and plan.overlaps(s.pending_b.index)):
                s.collect()  # no overlap: let the previous bucket land first
            tensors = s.timed("gather", bk.gather, it, b, seen)
            flat = s.timed("pack", self._pack, s, b, tensors) if s.transport.flattened else None
            s.note_peak(b)
            s.collect()
            fp.hit("sync.bucket")
            s.pending, s.pending_b = s.worker.submit(s.transport.send, engine, b, tensors, flat), b
            for h in hooks:
                s.timed(h.phase, h.on_bucket, b, tensors, flat)
        for _ in it:  # drain: the other ranks' collectives need every step of the export
            pass
        s.collect()
        fp.hit("sync.end")

    @staticmethod
    def _close_session(s: inflight.State, engine) -> None:
        s.transport.close(engine)
        s.worker.shutdown(wait=True)
        engine.end_weight_update()
        fp.hit("sync.version")
        # Buckets load with flush_cache=False; drop the prefix cache once, or prompts sharing a prefix with an
        # earlier request reuse KV computed by the old weights (log-prob gap ~0.8 seen on the arithmetic task).
        engine.flush_cache()
        if s.release:
            engine.resume_memory(["kv_cache"])
        engine.set_weight_version(s.version)

    # --- buffers --------------------------------------------------------------------------------------------
    def _pack(self, s: inflight.State, b: Bucket, tensors: dict) -> torch.Tensor:
        out = s.stage.region(b.nbytes) if s.stage is not None else self._buffer(b, s.cfg, s.device)
        flat = bk.pack(b, tensors, out)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return flat

    def _buffer(self, b, cfg: SyncConfig, device: str) -> torch.Tensor:
        if not b.oversize:
            return self.pool.take()
        buf = torch.empty(b.nbytes, dtype=torch.uint8, device=device)  # travels alone, freed after
        if cfg.transport == "colocated" and device == "cpu":
            buf.share_memory_()
        return buf


def _abort(s: inflight.State, engine, hooks: list[hk.Hook]) -> None:
    """A failed sync: best effort, never masking the original error (the engine may be the thing that
    failed). labkit.sync.atomic then restores the last good weights before the engine serves again."""
    if s.pending is not None:
        s.pending.cancel()
    if s.worker is not None:
        s.worker.shutdown(wait=False)
    cleanup = [h.abort for h in hooks] + [lambda: s.transport.close(engine), engine.end_weight_update]
    if s.release:
        cleanup.append(lambda: engine.resume_memory(["kv_cache"]))
    for step in cleanup:
        try:
            step()
        except Exception:
            pass
