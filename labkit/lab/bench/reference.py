"""What this box allows, measured in the same run as the syncs it is set against: the references of `labkit bench
sync` and the bound each transport cannot beat here.

Measured where the trainer's copies run (in a trainer rank's process, through Ray's `__ray_call__`), not in the
driver: a driver sample sees another process's memory traffic and reads lower, which flatters every ratio. Each
rate is the best of `reps`, and every sample is kept.

- `memcpy_gbps`: one copy of `nbytes` with every core (torch's intra-op threads), the classic reference;
- `two_copies_gbps`: the rate of each of two one-thread copies running at once: a two-copy path (the trainer packs
  bucket i + 1 while the engine's one-thread scheduler applies bucket i) moves every byte twice, concurrently;
- `hash_gbps`: the checksum labkit verifies with (labkit.engine.checksum), one thread, as the engine's scheduler
  hashes after a sync;
- `gloo_gbps`: a gloo broadcast between two processes over loopback, the wire of the distributed transport.

Bounds (`bounds`): transport-only, colocated and per-tensor by the two concurrent copies, direct by one copy,
distributed by the slower of the two copies and the broadcast; end to end adds one hash pass of the model (the
engine's checksums after the sync: the trainer's expectation is hashed between packs, overlapped).
"""

from __future__ import annotations

import os
import threading
import time

MIN_BYTES = 256 << 20  # a copy this large is a memory-bandwidth reference: a cache-sized one reads anything


def _best(fn, reps: int) -> tuple[float, list[float]]:
    samples = [fn() for _ in range(reps)]
    return min(samples), samples


def copy_rates(nbytes: int, reps: int = 3) -> dict:
    """In the calling process: every-core copy, two concurrent one-thread copies, one-thread hash. GB/s."""
    import torch

    from labkit.engine import checksum as ck

    n = max(nbytes, MIN_BYTES)
    src = [torch.empty(n, dtype=torch.uint8).fill_(1) for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]

    def one():
        t0 = time.perf_counter()
        dst[0].copy_(src[0])
        return time.perf_counter() - t0

    def two():
        threads = [threading.Thread(target=dst[i].copy_, args=(src[i],)) for i in range(2)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    def hashed():
        t0 = time.perf_counter()
        ck.checksum(src[0])
        return time.perf_counter() - t0

    every, every_s = _best(one, reps)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair, pair_s = _best(two, reps)
        hashing, hash_s = _best(hashed, reps)
    finally:
        torch.set_num_threads(before)
    gbps = lambda s: round(n / s / 1e9, 4)  # noqa: E731
    return {"memcpy_gbps": gbps(every), "two_copies_gbps": gbps(pair), "hash_gbps": gbps(hashing),
            "samples_s": {"memcpy": every_s, "two_copies": pair_s, "hash": hash_s}, "bytes": n,
            "threads": before, "pid": os.getpid()}


def in_trainer(trainer, nbytes: int, reps: int = 3) -> dict:
    """`copy_rates` run inside the trainer's rank 0 (the process whose copies a sync makes)."""
    import ray

    return ray.get(trainer.actors[0].__ray_call__.remote(lambda _self: copy_rates(nbytes, reps)), timeout=600)


def _gloo_peer(rank: int, port: int, n: int, reps: int, out) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        buf = torch.ones(n, dtype=torch.uint8) if rank == 0 else torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, src=0)  # the connection's first use
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.broadcast(buf, src=0)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out.put(times)
    finally:
        dist.destroy_process_group()


def gloo_gbps(nbytes: int, reps: int = 3, timeout_s: float = 300.0) -> dict:
    """A gloo broadcast of `nbytes` (at least MIN_BYTES) between two fresh processes over 127.0.0.1."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:  # a port free now; gloo's store binds it a moment later
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx, n = mp.get_context("spawn"), max(nbytes, MIN_BYTES)
    out = ctx.Queue()
    procs = [ctx.Process(target=_gloo_peer, args=(r, port, n, reps, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        times = out.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return {"gloo_gbps": round(n / min(times) / 1e9, 4), "samples_s": times, "bytes": n}


def bounds(nbytes: int, rates: dict) -> dict:
    """Seconds no sync of `nbytes` can beat on this box, per transport, transport-only and end to end."""
    two, one, gloo = rates["two_copies_gbps"], rates["memcpy_gbps"], rates.get("gloo_gbps")
    only = {"per-tensor": nbytes / (two * 1e9), "colocated": nbytes / (two * 1e9), "direct": nbytes / (one * 1e9)}
    if gloo:
        only["distributed"] = nbytes / (min(two, gloo) * 1e9)
    verify = nbytes / (rates["hash_gbps"] * 1e9)
    return {"transport_only": only, "end_to_end": {t: s + verify for t, s in only.items()}}
