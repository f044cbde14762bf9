"""Packing a planned bucket into one flat uint8 buffer, in SGLang's FlattenedTensorBucket layout.

Layout: tensors back to back as raw bytes (`t.flatten().view(uint8)`), metadata (name, shape, dtype, start, end, numel
in bytes) beside it. labkit packs into preallocated, reused buffers (`pack`; never a fresh tensor) so a sync allocates
nothing per bucket; on CPU they live in shared memory (a handle crosses processes, not the bytes), on GPU in device
memory (CUDA IPC handles).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os

import torch

from labkit import failpoints as fp
from labkit.engine.inside.apply import layout_key as _layout_key
from labkit.sync.plan import Bucket, TensorMeta


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spans(bucket: Bucket) -> list[tuple[TensorMeta, int, int]]:
    """(tensor, start byte, end byte) of each tensor in the bucket's packed layout: back to back, in plan order
    (what `pack` writes and every reader of a flat bucket assumes)."""
    out, offset = [], 0
    for t in bucket.tensors:
        out.append((t, offset, offset + t.nbytes))
        offset = out[-1][2]
    return out


def metadata(bucket: Bucket) -> list:
    """SGLang's FlattenedTensorMetadata list for `bucket` (byte offsets into the flat buffer)."""
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata  # SGLang is crossed here only

    return [FlattenedTensorMetadata(name=t.name, shape=torch.Size(t.shape), dtype=torch_dtype(t.dtype),
                                    start_idx=a, end_idx=b, numel=t.nbytes) for t, a, b in spans(bucket)]


@functools.lru_cache(maxsize=256)
def layout_key(bucket: Bucket) -> str:
    """The name labkit's engine-side loader reads a flat bucket by (labkit.engine.inside.apply.layout_key). Kept per
    bucket (a plan's buckets are the same every sync): building it took 0.45 ms for an MoE bucket of 465
    tensors, 4 ms of every sync of the 4,179-tensor model."""
    return _layout_key([(t.name, t.dtype, tuple(t.shape), a, b) for t, a, b in spans(bucket)])


def gather(it, b: Bucket, seen: set) -> dict:
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


def pack(bucket: Bucket, tensors: dict[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy `bucket`'s tensors (cast to the planned dtype) into `out[:bucket.nbytes]` and return that view.

    Each run of same-dtype tensors is one `torch.cat(..., out=)` into a typed view of the buffer: one call per run
    instead of one per tensor, which an MoE bucket of hundreds of expert tensors feels. A run that casts (fp32 master
    weights into a bf16 engine's layout) is one `torch._foreach_copy_` into views instead: torch.cat's casting path is
    slower per tensor than a multi-tensor copy (`labkit bench codec` times this pack); without a cast the two are even.
    A run the typed view cannot take (a byte offset not a multiple of its element size, a source on another device) is
    copied tensor by tensor."""
    if out.dtype != torch.uint8 or out.numel() < bucket.nbytes:
        raise ValueError(f"buffer of {out.numel()} {out.dtype} cannot hold bucket {bucket.index} "
                         f"({bucket.nbytes} bytes)")
    srcs = []
    for meta in bucket.tensors:
        t = tensors[meta.name]
        if t.shape != meta.shape:
            raise ValueError(f"{meta.name}: shape {tuple(t.shape)} != planned {meta.shape}")
        srcs.append(t.detach() if t.requires_grad else t)
    flat, half = out[: bucket.nbytes], len(srcs) // 2
    _copy_runs(bucket.tensors[:half], srcs[:half], flat, 0)
    fp.hit("bucket.pack")  # `labkit faults`: a failure half way through a pack
    _copy_runs(bucket.tensors[half:], srcs[half:], flat, sum(m.nbytes for m in bucket.tensors[:half]))
    return flat


def _copy_runs(metas, srcs: list[torch.Tensor], flat: torch.Tensor, offset: int) -> None:
    """Copy `srcs` back to back into `flat` from byte `offset`, one `torch.cat` per run of one planned dtype."""
    i = 0
    while i < len(metas):
        j, dtype = i, metas[i].dtype
        while j < len(metas) and metas[j].dtype == dtype:
            j += 1
        nbytes = sum(m.nbytes for m in metas[i:j])
        region, typed = flat[offset: offset + nbytes], None
        if all(t.device == flat.device for t in srcs[i:j]):
            try:
                typed = region.view(torch_dtype(dtype))
            except RuntimeError:  # misaligned for this dtype
                pass
        if typed is not None:
            run = [t.reshape(-1) for t in srcs[i:j]]
            if all(t.dtype == typed.dtype for t in run):
                torch.cat(run, out=typed)
            else:  # a cast: one multi-tensor copy into views (torch.cat's casting path is slower: `pack`)
                torch._foreach_copy_(list(typed.split([t.numel() for t in run])), run)
        else:
            at = 0
            for m, t in zip(metas[i:j], srcs[i:j]):
                src = t.to(device=flat.device, dtype=torch_dtype(m.dtype)).contiguous()
                region[at: at + m.nbytes].copy_(src.reshape(-1).view(torch.uint8))
                at += m.nbytes
        offset, i = offset + nbytes, j


@contextlib.contextmanager
def host_threads(device: str, threads: int | None = None, cross_node: bool = False):
    """While a CPU sync streams, torch's intra-op threads in this process: every core but one, which is the engine's.
    The engine applies bucket i (on one thread: SGLang's CPU scheduler runs torch with one) while this process gathers
    and packs bucket i + 1; a trainer with as many threads as cores oversubscribed the box, and each parallel copy
    waited on its thread that the engine had displaced (`scripts/host_threads_ab.py` interleaves the two rules:
    data/host_threads_ab_cpu.json). On a GPU the copies run on the device, and an engine on another node (`cross_node`)
    has its own cores: nothing changes there. `threads` (SyncConfig.host_threads) overrides the rule on CPU."""
    before = torch.get_num_threads()
    keep = before if cross_node else max(1, min(before, (os.cpu_count() or 1) - 1))
    use = before if device != "cpu" else threads or keep
    torch.set_num_threads(use)
    try:
        yield use
    finally:
        torch.set_num_threads(before)


def offsets(bucket: Bucket) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    """(name, dtype, shape, byte offset) of each tensor in the bucket's packed layout (`pack`)."""
    return [(t.name, torch_dtype(t.dtype), t.shape, a) for t, a, _ in spans(bucket)]


def unpack(bucket: Bucket, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views of each tensor inside `flat` (no copy)."""
    return [(t.name, flat[a:b].view(torch_dtype(t.dtype)).reshape(t.shape)) for t, a, b in spans(bucket)]


class BufferPool:
    """Two reusable flat buffers (pack the next bucket while the engine loads the current one)."""

    def __init__(self, nbytes: int, device: str = "cpu", shared: bool = False, slots: int = 2):
        self.nbytes, self.device, self.shared = nbytes, device, shared
        self.buffers = []
        for _ in range(slots):
            b = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
            if shared and b.device.type == "cpu":
                b.share_memory_()  # file_system strategy: a handle names the shm file, the bytes stay put
            self.buffers.append(b)
        self._next = 0

    def take(self) -> torch.Tensor:
        if not self.buffers:
            raise RuntimeError("BufferPool.take() after close(): the pool's buffers were released")
        b = self.buffers[self._next]
        self._next = (self._next + 1) % len(self.buffers)
        return b

    @property
    def allocated_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def close(self) -> None:
        """Drop the buffers so their memory goes back now, in the process that owns them. Idempotent. A shared CPU
        buffer is a `/dev/shm/torch_<pid>_*` file that torch unlinks when its last reference goes; an owner that is
        SIGKILLed (`ray.kill`) never gets there and the file, a bucket's size of RAM, outlives it: call this first."""
        self.buffers.clear()
        self._next = 0
        if self.shared:
            gc.collect()  # a reference cycle may still hold a storage; the unlink happens on its last release
