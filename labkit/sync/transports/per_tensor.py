"""The baseline: one engine call per tensor, no flat buffer."""

from __future__ import annotations

import time

import torch

from labkit.engine.contract import call_group, standalone
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket


def send_per_call(engine, metas, tensors: dict[str, torch.Tensor]) -> None:
    """One `update_weights_from_tensor([(name, tensor), ...])` per call group of `metas` (call_group: DeepSeek's MLA
    a-pair goes with q_b, in one call as SGLang needs), each tensor a private host copy in its planned dtype."""
    calls: dict[str, list] = {}
    alone = standalone(meta.name for meta in metas)
    for meta in metas:
        # A copy, always: handing a CPU tensor to an engine moves its storage into shared memory in place
        # (torch's file_system sharing), which would race with the syncer hashing the same export tensor
        # (a wrong expected checksum, seen under load) and put the trainer's own storage into /dev/shm.
        t = tensors[meta.name].detach().to("cpu", bk.torch_dtype(meta.dtype), copy=True).contiguous()
        calls.setdefault(call_group(meta.name, alone), []).append((meta.name, t))
    for named in calls.values():
        engine.update_weights_from_tensor(named, flush_cache=False)


class PerTensor:
    """transport="per-tensor", what verl did before PR #2418: `send_per_call` per bucket (one tensor, or one call group,
    in the per-tensor plan); the engine (or the HTTP client) serializes a handle to each tensor, loads them, answers."""

    name = "per-tensor"
    flattened = False
    port_retries = 0
    same_node = True

    def open(self, engine, plan) -> None:
        pass

    def send(self, engine, b: Bucket, tensors: dict[str, torch.Tensor], flat=None) -> dict:
        t0 = time.perf_counter()
        send_per_call(engine, b.tensors, tensors)
        return {"load": time.perf_counter() - t0}

    def close(self, engine) -> None:
        pass
