"""`labkit bench device`, the trainer's side: one model synced into the engine stand-in (labkit.workbench.
device_engine) through labkit's colocated data path, on whatever device this is (a GPU: CUDA IPC; CPU: shm).

Per bucket, as the syncer does it (labkit.sync.session): pack into the pool's reused flat buffer (`bucket.pack`;
an oversize bucket into a fresh one) -> synchronize -> a handle to it (`ipc.dumps`: SGLang's payload format,
device UUIDs) -> the engine maps it (kept across syncs) and copies by its compiled plan (`apply.load_flat`) ->
its answer frees the buffer for bucket i + 2. The next bucket packs while the engine applies this one.
Verification: labkit's checksums of what was exported (`hooks.Checksums`, fused groups rebuilt) against the
engine's hash of its own parameters, by the same function on both sides (`checksum.checksum`).
"""

from __future__ import annotations

import statistics
import time

import torch

from labkit.engine import ipc
from labkit.engine.contract import part_counts
from labkit.sync import bucket as bk
from labkit.sync import verify as vf
from labkit.sync.delta import DeltaState
from labkit.sync.hooks import Checksums
from labkit.sync.plan import TensorMeta, plan_buckets


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class EngineProc:
    """The engine stand-in in a spawned process; every reply waited for at most `timeout_s`."""

    def __init__(self, device: str, timeout_s: float = 300.0):
        from labkit.lab.device import engine as device_engine

        ctx = torch.multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=device_engine.serve, args=(child, device), daemon=True,
                                name="labkit-engine-stand-in")
        self.proc.start()
        self.timeout_s = timeout_s

    def call(self, *request):
        self.conn.send(request)
        return self.reply()

    def reply(self):
        if not self.conn.poll(self.timeout_s):
            raise TimeoutError(f"engine stand-in gave no answer within {self.timeout_s:.0f} s")
        out = self.conn.recv()
        if out[0] != "ok":
            raise RuntimeError(f"engine stand-in failed:\n{out[1]}")
        return out[1:]

    def close(self) -> None:
        try:
            self.call("stop")
        except Exception:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


def source(tensors: tuple[TensorMeta, ...], device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The trainer's weights: random values in each tensor's dtype, on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {t.name: (torch.randn(t.shape, generator=gen, device=device) * 0.02).to(bk.torch_dtype(t.dtype))
            for t in tensors}


def bump(src: dict[str, torch.Tensor], k: int) -> None:
    """Change one word of every tensor (word k, wrapped): each sync then carries weights the engine lacks, so a
    bucket that never landed fails verification instead of matching the previous sync's bytes."""
    for t in src.values():
        words = t.view(-1).view(torch.uint8)
        words[(2 * k) % words.numel()] ^= 1


def change(src: dict[str, torch.Tensor], fraction: float, seed: int) -> None:
    """Flip the low bit of about `fraction` of every tensor's 16-bit words (a small step's changed words)."""
    for i, t in enumerate(src.values()):
        gen = torch.Generator(device=t.device).manual_seed(seed * 100_003 + i)
        words = t.view(-1).view(torch.int16)
        words[torch.rand(words.numel(), generator=gen, device=t.device) < fraction] ^= 1


class TrainerSide:
    """A model's plan and reused buffers, and syncs of `src` into the engine through them."""

    def __init__(self, tensors: tuple[TensorMeta, ...], bucket_bytes: int, device: str, engine: EngineProc,
                 algo: str, slots: int = 2):
        self.plan = plan_buckets(tensors, bucket_bytes)
        self.device, self.engine, self.algo = device, engine, algo
        normal = max((b.nbytes for b in self.plan.buckets if not b.oversize), default=1)
        self.pool = bk.BufferPool(normal, device=device, shared=device == "cpu", slots=slots)
        self.sizes = part_counts(t.name for t in tensors)

    def sync(self, src: dict[str, torch.Tensor], delta: DeltaState | None = None, overlap: bool = True) -> dict:
        """Every bucket once; seconds of each phase, the storages the engine's handles resolved to. With two
        buffers the next bucket packs while the engine applies this one; with one (or `overlap` off), only after
        its answer."""
        r = {"pack": 0.0, "pack_host": 0.0, "deserialize": 0.0, "apply": 0.0, "apply_host": 0.0, "ptrs": [],
             "oversize_ptrs": []}
        t0, pending, ahead = time.perf_counter(), None, overlap and len(self.pool.buffers) > 1
        for b in self.plan.buckets:
            if pending is not None and not ahead:  # one buffer: the previous bucket's answer frees it
                self._collect(r, *pending)
                pending = None
            t = time.perf_counter()
            out = self.pool.take() if not b.oversize else torch.empty(b.nbytes, dtype=torch.uint8, device=self.device)
            if b.oversize and self.device == "cpu":
                out.share_memory_()
            flat = bk.pack(b, {m.name: src[m.name] for m in b.tensors}, out)
            r["pack_host"] += time.perf_counter() - t
            synchronize(self.device)
            r["pack"] += time.perf_counter() - t
            if pending is not None:
                self._collect(r, *pending)
            key = bk.layout_key(b)
            if delta is not None:  # after the previous answer: the payload pool has one slot
                flat, key = delta.encode(b, flat, key)
                synchronize(self.device)
            self.engine.conn.send(("apply", ipc.dumps([(key, flat)])))
            pending = (b, flat)
        self._collect(r, *pending)
        r["apply_path"] = self.engine.call("end_sync")[0]
        r["seconds"] = time.perf_counter() - t0
        return r

    def _collect(self, r: dict, b, flat) -> None:
        deser, applied, host, ptr = self.engine.reply()
        r["deserialize"] += deser
        r["apply"] += applied
        r["apply_host"] += host
        r["oversize_ptrs" if b.oversize else "ptrs"].append(ptr)

    def expected(self, src: dict[str, torch.Tensor]) -> dict[str, str]:
        hook = Checksums(self.sizes, 1, self.algo)
        for b in self.plan.buckets:
            hook.on_bucket(b, {m.name: src[m.name] for m in b.tensors}, None)
        return hook.expected.finish()

    def verify(self, src: dict[str, torch.Tensor]) -> dict:
        """The sync's own check: labkit's expectation from the exported tensors against the engine's hashes."""
        t0 = time.perf_counter()
        want = self.expected(src)
        t1 = time.perf_counter()
        got, engine_s = self.engine.call("checksums", self.algo)
        out = vf.compare(want, got)
        out["corrupted"] = sum(got.get(n) != v for n, v in want.items())
        out["trainer_hash_s"], out["engine_hash_s"] = t1 - t0, engine_s
        return out

    def close(self) -> None:
        self.pool.close()


def gbps(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else None


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
