"""Trainer and engine on one host: a handle to the flat buffer crosses, the bytes stay put."""

from __future__ import annotations

import time

import torch

from labkit import failpoints as fp
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket


class Colocated:
    """transport="colocated": SGLang's `flattened_bucket` load format over a shared buffer.

    Flow:
    1. open: ask the engine its TP size;
    2. send, per bucket: serialize a handle to the flat buffer (shared memory on CPU, a CUDA IPC handle on
       GPU) with the bucket's FlattenedTensorMetadata -> `engine.update_weights_from_tensor([payload] * tp,
       load_format="flattened_bucket", flush_cache=False)`: each engine TP rank opens the same handle and
       reads its own shard; the call returns once every rank loaded it;
    3. close: nothing (the buffers are the syncer's, reused for the next bucket but one).
    """

    name = "colocated"
    flattened = True
    port_retries = 0

    def open(self, engine, plan) -> None:
        # SGLang is crossed here only. Imported in `open` (timed as setup), not on the first `send`: there it
        # ran on the worker thread outside every phase, and a cold sync's stack fell ~0.5 s short of its wall.
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync import tensor_bucket  # noqa: F401  (bk.metadata's import, warmed here)

        self.serializer = MultiprocessingSerializer
        self.engine_tp = engine.tp_size

    def send(self, engine, b: Bucket, tensors=None, flat: torch.Tensor | None = None) -> dict:
        t0 = time.perf_counter()
        fp.hit("transport.send", flat=flat)
        payload = self.serializer.serialize({"flattened_tensor": flat, "metadata": bk.metadata(b)},
                                            output_str=True)
        t1 = time.perf_counter()
        # One payload per engine TP rank: each rank opens the same handle and reads its own shard.
        engine.update_weights_from_tensor([payload] * self.engine_tp, load_format="flattened_bucket",
                                          flush_cache=False)
        return {"transfer": t1 - t0, "load": time.perf_counter() - t1}

    def close(self, engine) -> None:
        pass
