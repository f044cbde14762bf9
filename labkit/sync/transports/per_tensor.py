"""The baseline: one engine call per tensor, no flat buffer."""

from __future__ import annotations

import time

import torch

from labkit.engine.contract import call_group
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket


class PerTensor:
    """transport="per-tensor": what verl did before PR #2418.

    Flow, per tensor of the bucket (a bucket is one tensor in the per-tensor plan, or DeepSeek's MLA a-pair
    with q_b, which SGLang must get in one call: labkit.engine.contract.call_group):
    1. cast the exported tensor to the engine dtype, as a private host copy;
    2. `engine.update_weights_from_tensor([(name, tensor), ...], flush_cache=False)`, one call per call group:
       the engine (or the HTTP client) serializes a handle to each tensor, the engine loads them and answers.
    """

    name = "per-tensor"
    flattened = False
    port_retries = 0
    same_node = True

    def open(self, engine, plan) -> None:
        pass

    def send(self, engine, b: Bucket, tensors: dict[str, torch.Tensor], flat=None) -> dict:
        t0 = time.perf_counter()
        calls: dict[str, list] = {}
        for meta in b.tensors:
            # A copy, always: handing a CPU tensor to an engine moves its storage into shared memory in place
            # (torch's file_system sharing), which would race with the syncer hashing the same export tensor
            # (a wrong expected checksum, seen under load) and put the trainer's own storage into /dev/shm.
            t = tensors[meta.name].detach().to("cpu", bk.torch_dtype(meta.dtype), copy=True).contiguous()
            calls.setdefault(call_group(meta.name), []).append((meta.name, t))
        for named in calls.values():
            engine.update_weights_from_tensor(named, flush_cache=False)
        return {"load": time.perf_counter() - t0}

    def close(self, engine) -> None:
        pass
