"""One sync = one SGLang weight-update session, measured phase by phase.

begin_weight_update -> for each bucket: gather (pull from the trainer's export) -> pack (flat buffer) ->
transfer + load (transport; overlapped with packing the next bucket) -> end_weight_update -> new
weight_version -> verify (checksums, trainer side vs engine side).

Runs on the trainer rank that holds the full exported tensors (rank 0); the other ranks only drain the
export generator, whose collectives need every rank. With `stage_dir` set (labkit.sync.atomic does), every
tensor sent is also written to a host-side copy there (`timing/sync/stage`): the rollback source of the
next sync. Every wait is bounded by `timeout_s`; named failpoints (labkit.failpoints) mark where
`labkit faults` injects faults.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from labkit.sync import bucket as bk
from labkit import failpoints as fp
from labkit.sync import lastgood
from labkit.sync import verify as vf
from labkit.sync.plan import Plan, TensorMeta, check_coverage, excluding, plan_buckets
from labkit.sync.config import MB, SyncConfig
from labkit.sync.transport import make

def metas_of(named) -> list[TensorMeta]:
    return [TensorMeta(n, tuple(t.shape), bk.dtype_name(t.dtype)) for n, t in named]


def make_plan(metas: list[TensorMeta], cfg: SyncConfig, engine_dtype: str | None = None) -> Plan:
    if engine_dtype:  # the engine serves in its own dtype; cast on the trainer side while packing
        metas = [TensorMeta(m.name, m.shape, engine_dtype if m.dtype.startswith(("float", "bfloat")) else m.dtype)
                 for m in metas]
    if cfg.transport == "per-tensor":
        return plan_buckets(metas, 1, group=lambda n: n)  # one tensor per call, the baseline
    budget = int(cfg.memory_budget_mb * MB) if cfg.memory_budget_mb else None
    return plan_buckets(metas, cfg.bucket_bytes, budget_bytes=budget)


def _sync_device() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Syncer:
    """Holds the replayed plan and the reusable buffers of one trainer rank across syncs."""

    def __init__(self):
        self.plan: Plan | None = None
        self.pool: bk.BufferPool | None = None
        self.version = 0

    def run(self, named_iter, engine, cfg: SyncConfig, engine_spec: dict | None = None,
            weight_version: str | None = None, exclude: tuple[str, ...] = ()) -> dict:
        """`exclude`: name substrings left out on purpose (they stay unchanged and are reported unverified)."""
        from tqdm.auto import tqdm

        t_start = time.perf_counter()
        phases = dict.fromkeys(("gather", "pack", "transfer", "load", "verify", "stage", "session", "setup"), 0.0)
        transport = make(cfg.transport, timeout_s=cfg.timeout_s)
        excluded: list[str] = []
        named_iter = excluding(named_iter, tuple(exclude), excluded) if exclude else named_iter
        replan = self.plan is None or self.plan.bucket_bytes != (1 if cfg.transport == "per-tensor" else cfg.bucket_bytes)
        if replan:
            named_iter = list(named_iter)  # first sync: learn the tensor list, then replay the plan
            phases["gather"] += time.perf_counter() - t_start
        t_setup = time.perf_counter()  # plan, validation, buffers, transport: paid in full on a first sync
        if replan:
            self.plan = make_plan(metas_of(named_iter), cfg, engine_spec and engine_spec.get("dtype"))
            self.pool = None
        plan = self.plan
        try:  # before the first byte moves
            unverified = check_coverage(plan, None if engine_spec is None else engine_spec["tensors"], tuple(exclude),
                                        len(excluded))
        except ValueError:
            self.plan = None  # a bad plan is not replayed: the next sync lists the export again
            raise
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            # Handles to CPU tensors must name shm files: the default fd strategy's handshake is refused
            # across unrelated processes and kills SGLang's scheduler (AuthenticationError).
            torch.multiprocessing.set_sharing_strategy("file_system")
        normal = max((b.nbytes for b in plan.buckets if not b.oversize), default=1)
        if transport.flattened and (self.pool is None or self.pool.nbytes < normal):
            self.pool = bk.BufferPool(normal, device=device, shared=cfg.transport == "colocated")
        # Memory the sync adds: the reusable flat buffers (or, per tensor, one cast copy in flight).
        extra = self.pool.allocated_bytes if transport.flattened else plan.largest_tensor_bytes
        peak = extra

        version = weight_version or f"v{self.version + 1}"
        release = torch.cuda.is_available() if cfg.release_kv_cache is None else cfg.release_kv_cache
        t_s = time.perf_counter()
        phases["setup"] += t_s - t_setup
        if release:  # free the KV cache while weights are in flight (slime/verl choreography)
            engine.release_memory(["kv_cache"])
        engine.begin_weight_update(selector=cfg.selector)
        phases["session"] += time.perf_counter() - t_s
        pool = ThreadPoolExecutor(1, thread_name_prefix="labkit-sync")
        pending, pending_b, seen, expected, kept = None, None, set(), vf.Expected(), {}
        stage = lastgood.Writer(cfg.stage_dir) if cfg.stage_dir else None
        try:
            fp.hit("sync.begin")
            t_o = time.perf_counter()
            transport.open(engine, plan)
            phases["setup"] += time.perf_counter() - t_o
            it = iter(named_iter)
            bar = tqdm(plan.buckets, desc=f"sync[{cfg.transport}]", unit="bucket", disable=not cfg.progress,
                       mininterval=1.0)
            for b in bar:
                if pending is not None and not (cfg.overlap and plan.overlaps(pending_b.index)):
                    self._collect(pending, phases)  # no overlap: let the previous bucket land first
                    pending = None
                t0 = time.perf_counter()
                tensors = self._gather(it, b, seen)
                t1 = time.perf_counter()
                flat = None
                if transport.flattened:
                    flat = bk.pack(b, tensors, self._buffer(b, cfg, device))
                    _sync_device()
                t2 = time.perf_counter()
                phases["gather"] += t1 - t0
                phases["pack"] += t2 - t1
                in_flight = pending_b.nbytes if pending is not None and pending_b.oversize else 0
                peak = max(peak, extra + (b.nbytes if b.oversize else 0) + in_flight)
                if pending is not None:
                    self._collect(pending, phases)
                fp.hit("sync.bucket")
                pending, pending_b = pool.submit(transport.send, engine, b, tensors, flat), b
                self._keep(b, tensors, flat, cfg, stage, expected, kept, phases)
            for _ in it:  # drain: the other ranks' collectives need every step of the export
                pass
            if pending is not None:
                self._collect(pending, phases)
                pending = None
            fp.hit("sync.end")
        except BaseException:
            if pending is not None:
                pending.cancel()
            if stage is not None:
                stage.abort()
            pool.shutdown(wait=False)
            # Best effort, never masking the original error: the engine may be the thing that failed.
            # (labkit.sync.atomic then restores the last good weights before the engine serves again.)
            cleanup = [lambda: transport.close(engine), engine.end_weight_update]
            if release:
                cleanup.append(lambda: engine.resume_memory(["kv_cache"]))
            for step in cleanup:
                try:
                    step()
                except Exception:
                    pass
            raise
        t_s = time.perf_counter()
        transport.close(engine)
        pool.shutdown(wait=True)
        engine.end_weight_update()
        fp.hit("sync.version")
        # Buckets load with flush_cache=False; drop the prefix cache once, or prompts sharing a prefix with an
        # earlier request reuse KV computed by the old weights (log-prob gap ~0.8 seen on the arithmetic task).
        engine.flush_cache()
        if release:
            engine.resume_memory(["kv_cache"])
        engine.set_weight_version(version)
        phases["session"] += time.perf_counter() - t_s
        self.version += 1

        result = {"sync/verified": None, "sync/unverified": None if unverified is None else unverified[:20],
                  "sync/num_unverified": None if unverified is None else len(unverified)}
        if cfg.verify != "none":
            t3 = time.perf_counter()
            if cfg.verify == "full":
                result.update(vf.compare_full(kept, engine.get_weights_by_name))
            else:
                result.update(vf.compare(expected.finish(), engine.checksums()))
            phases["verify"] += time.perf_counter() - t3
        if stage is not None:
            t3 = time.perf_counter()
            result["sync/staged"] = stage.finish(version)
            result["sync/stage_bytes"] = stage.nbytes  # host memory (tmpfs) the rollback copy holds
            phases["stage"] += time.perf_counter() - t3
        total = time.perf_counter() - t_start
        nbytes = plan.total_bytes
        out = {f"timing/sync/{k}": round(v, 6) for k, v in phases.items()}
        out.update({
            "timing/sync/total": round(total, 6),
            "sync/transport": cfg.transport,
            "sync/bytes": nbytes,
            "sync/num_tensors": len(plan.tensors),
            "sync/num_buckets": len(plan.buckets),
            "sync/bucket_bytes": plan.bucket_bytes,
            "sync/gbps": round(nbytes / max(total - phases["verify"], 1e-9) / 1e9, 4),
            "sync/peak_extra_bytes": peak,
            "sync/largest_tensor_bytes": plan.largest_tensor_bytes,
            "sync/weight_version": version,
            "sync/port_retries": getattr(transport, "port_retries", 0),
            **result,
        })
        return out

    @staticmethod
    def _keep(b, tensors: dict, flat, cfg: SyncConfig, stage, expected: vf.Expected, kept: dict, phases: dict) -> None:
        """Once bucket b is handed to the transport: the rollback copy (`stage`, from the flat buffer, before
        it is reused for bucket i+2) and the expected checksums. Those are hashed from the EXPORTED tensors
        cast to the engine dtype (the packer's cast), never from the packed buffer: a packing bug (wrong
        offset, wrong cast) then fails verification instead of being hashed into the expectation."""
        t0 = time.perf_counter()
        if stage is not None:
            stage.add(dict(bk.unpack(b, flat)) if flat is not None else {
                m.name: tensors[m.name].detach().to("cpu", bk.torch_dtype(m.dtype)) for m in b.tensors})
            t1 = time.perf_counter()
            phases["stage"] += t1 - t0
            t0 = t1
        if cfg.verify == "none":
            return
        cast = {m.name: tensors[m.name].detach().to(bk.torch_dtype(m.dtype)) for m in b.tensors}
        expected.add(cast)
        if cfg.verify == "full":
            kept.update({n: t.to("cpu", copy=True) for n, t in cast.items()})
        phases["verify"] += time.perf_counter() - t0

    def _buffer(self, b, cfg: SyncConfig, device: str) -> torch.Tensor:
        if not b.oversize:
            return self.pool.take()
        buf = torch.empty(b.nbytes, dtype=torch.uint8, device=device)  # travels alone, freed after
        if cfg.transport == "colocated" and device == "cpu":
            buf.share_memory_()
        return buf

    @staticmethod
    def _gather(it, b, seen: set) -> dict:
        """Pull this bucket's tensors from the export (plan order == export order, duplicates skipped)."""
        tensors = {}
        for name, t in it:
            if name in seen:
                continue  # duplicates (PP>1 + MTP) were dropped from the plan
            seen.add(name)
            tensors[name] = t
            if len(tensors) == len(b.tensors):
                break
        if set(tensors) != set(b.names):
            lost, extra = sorted(set(b.names) - set(tensors)), sorted(set(tensors) - set(b.names))
            raise RuntimeError(f"export order changed since the plan was made (bucket {b.index}): planned but not "
                               f"exported in order {lost[:3]}, unplanned {extra[:3]}")
        return tensors

    @staticmethod
    def _collect(fut, phases: dict) -> None:
        for k, v in fut.result().items():
            phases[k] += v
