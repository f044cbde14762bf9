"""Trainer and engine on one host: a handle to the flat buffer crosses, the bytes stay put."""

from __future__ import annotations

import time

import torch

from labkit import failpoints as fp
from labkit.engine import ipc
from labkit.engine.inside import colocated as stagefile
from labkit.engine.config import APPLY_FORMAT
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket
from labkit.sync.transports.ring import Ring


def loader_is_labkit(engine_loader: str) -> bool:
    """SyncConfig.engine_loader as this process resolves it: auto is labkit's loader without CUDA, SGLang's with."""
    return engine_loader == "labkit" or (engine_loader == "auto" and not torch.cuda.is_available())


class Colocated:
    """transport="colocated": one flat buffer per bucket in shared memory (a CUDA IPC handle on GPU); only a handle to
    it crosses to the engine.

    Flow:
    1. open: ask the engine its TP size and whether it accepts labkit's loader (`labkit.engine.inside.apply`, listed at
       launch by labkit's engines; `SyncConfig.engine_loader`: on GPU only with "labkit", never with "sglang");
    2. send, per bucket: serialize a handle to the flat buffer ->
       - labkit's loader: `[(layout_key, flat)]`, load_format=APPLY_FORMAT: the engine keeps the buffer mapped for the
         rest of the sync and copies each tensor into its parameter slice by a plan compiled once;
       - otherwise SGLang's `flattened_bucket` (`FlattenedTensorMetadata` list): the engine maps the segment afresh and
         runs `model.load_weights` over the views;
       `engine.update_weights_from_tensor([payload] * tp, ..., flush_cache=False)`: each engine TP rank opens the same
       handle; the call returns once every rank loaded it. With labkit's loader at TP=1 the payloads go over the sync's
       ring instead (labkit.sync.transports.ring): one engine call, opened by the first bucket and open for the whole
       sync, each payload sent over a local socket, no call per bucket;
    3. close: read which path applied the tensors (`apply_path`); the engine lets go of the buffers (they are the
       syncer's, reused next sync).
    Under the atomic guard (labkit's loader, no delta) the syncer packs each bucket straight into the guard's staging
    file (`files`, labkit.sync.lastgood) instead of a shared bucket: the payload then names that file and the bucket's
    offset (labkit.engine.inside.colocated), the engine keeps the file mapped, and the rollback copy costs no copy of
    its own. With `delta` (labkit.sync.delta), step 2 first encodes the bucket against the copy of what the engine holds
    and sends the change mask and changed words instead (labkit's loader only).
    """

    name = "colocated"
    flattened = True
    port_retries = 0
    same_node = True

    def __init__(self, delta=None, engine_loader: str = "auto"):
        self.delta, self.engine_loader = delta, engine_loader
        self.files = None  # the atomic guard's staging writer, when the syncer packs buckets into it
        self.ring: Ring | None = None

    @property
    def packs_into_stage(self) -> bool:
        """Whether the engine can read a bucket where it lies in the guard's staging file (labkit's loader)."""
        return self.fmt == APPLY_FORMAT and self.delta is None

    def open(self, engine, plan) -> None:
        self.serializer = ipc.Serializer  # SGLang's payload format, written by labkit (device UUIDs on GPU)
        self.engine_tp = engine.tp_size
        labkit = loader_is_labkit(self.engine_loader)  # SyncConfig.engine_loader says why a GPU defaults to SGLang's
        self.fmt = APPLY_FORMAT if labkit and engine.accepts(APPLY_FORMAT) else "flattened_bucket"
        if self.fmt == "flattened_bucket":  # SGLang's format is SGLang's: crossed here only, timed as setup
            from sglang.srt.weight_sync import tensor_bucket  # noqa: F401  (bk.metadata's import, warmed here)
        self.apply_path = "load_weights"
        self.ring, self.buckets = None, len(plan.buckets)
        self.rings = self.fmt == APPLY_FORMAT and self.engine_tp == 1
        if self.delta is not None and self.fmt != APPLY_FORMAT:
            raise ValueError("delta sync needs labkit's engine-side loader (labkit.engine.inside.apply: an engine "
                             "launched by labkit, on GPU with SyncConfig.engine_loader='labkit'); this engine takes "
                             f"{self.fmt!r}: sync with SyncConfig.delta=0")

    def send(self, engine, b: Bucket, tensors=None, flat: torch.Tensor | None = None) -> dict:
        t0 = time.perf_counter()
        key, encode = bk.layout_key(b), 0.0
        if self.delta is not None:
            flat, key = self.delta.encode(b, flat, key)
            encode, t0 = time.perf_counter() - t0, time.perf_counter()
        fp.hit("transport.send", flat=flat)
        at = self.files.locate(flat) if self.files is not None else None
        if at is not None:  # the bucket lies in the staging file: name the file, not a handle to a segment
            named = [(stagefile.key(*at, key), torch.zeros(1, dtype=torch.uint8))]
        elif self.fmt == APPLY_FORMAT:
            named = [(key, flat)]
        else:
            named = {"flattened_tensor": flat, "metadata": bk.metadata(b)}
        if self.rings:
            return self._send_ring(engine, self.serializer.serialize(named), encode, t0)
        payload = self.serializer.serialize(named, output_str=True)
        t1 = time.perf_counter()
        # One payload per engine TP rank: each rank opens the same handle and reads its own shard.
        engine.update_weights_from_tensor([payload] * self.engine_tp, load_format=self.fmt, flush_cache=False)
        return {"encode": encode, "transfer": t1 - t0, "load": time.perf_counter() - t1}

    def _send_ring(self, engine, payload: bytes, encode: float, t0: float) -> dict:
        if self.ring is None:  # the first bucket opens the sync's one call (charged to its `transfer`)
            self.ring = Ring(engine, self.serializer, self.buckets, engine.call_timeout_s)
        t1 = time.perf_counter()
        sent = self.ring.send(payload)
        if self.ring.acked == self.buckets:  # the last bucket: the call's answer is part of applying it
            ring, self.ring = self.ring, None
            ring.finish()
        return {"encode": encode, "transfer": t1 - t0 + sent, "load": time.perf_counter() - t1 - sent}

    def close(self, engine) -> None:
        if self.ring is not None:  # a sync that failed before its last bucket: end the call, never raising
            ring, self.ring = self.ring, None
            ring.abort()
        if self.fmt == APPLY_FORMAT:
            self.apply_path = engine.apply_path()

