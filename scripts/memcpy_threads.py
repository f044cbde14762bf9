"""What bounds a CPU sync's copies on this box: one copy of the bench model's bytes on one thread and on every
core (what `labkit bench sync` takes as its reference, `bench/memcpy_gbps`), and two one-thread copies at once in
two processes (what a colocated sync does: the trainer packs a bucket while the engine copies the one before).
Each byte of a colocated sync is copied twice, so the pair's rate halved is the most a two-copy path can move;
`direct` copies once, on the one thread the trainer keeps while it streams. Writes one JSON file.

    python scripts/memcpy_threads.py [--mb 317] [--reps 7] [--rounds 3] [--out data/memcpy_threads_cpu.json]
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import torch

from labkit import provenance


def best_copy_seconds(nbytes: int, reps: int, threads: int) -> float:
    """Best of `reps` copies of `nbytes` between two preallocated buffers (the first rep faults the pages in)."""
    torch.set_num_threads(threads)
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return best


def _one_of_two(nbytes: int, reps: int, start, ready, out) -> None:
    torch.set_num_threads(1)
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before the timed copies
    times = []
    for _ in range(reps):
        ready.wait()
        start.wait()
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    out.put(times)


def concurrent_pair_seconds(nbytes: int, reps: int) -> float:
    """Best of `reps` rounds in which two processes each copy `nbytes` on one thread, started together; a round
    lasts until the slower of the two is done."""
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Barrier(3), ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_one_of_two, args=(nbytes, reps, start, ready, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for _ in range(reps):
        ready.wait()
        start.wait()
    a, b = out.get(timeout=600), out.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return min(max(x, y) for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=317.0, help="bytes per copy, in MB (the bench model: 317)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3, help="the three measurements, one after the other, this often")
    ap.add_argument("--out", default="data/memcpy_threads_cpu.json")
    a = ap.parse_args()
    prov = provenance.collect(config=vars(a))  # the code as the run starts
    nbytes, cores = int(a.mb * 1e6), os.cpu_count() or 1
    rounds = []
    for _ in range(a.rounds):
        one = nbytes / best_copy_seconds(nbytes, a.reps, 1) / 1e9
        every = nbytes / best_copy_seconds(nbytes, a.reps, cores) / 1e9
        pair = 2 * nbytes / concurrent_pair_seconds(nbytes, a.reps) / 1e9
        rounds.append({
            "gbps_one_thread": round(one, 3),
            "gbps_every_core": round(every, 3),  # the sync bench's reference
            "gbps_two_one_thread_copies_together": round(pair, 3),  # both copies' bytes over the round's time
            # a two-copy path moves each byte twice: the pair's rate halved, over the reference
            "two_copy_ceiling_vs_reference": round(pair / 2 / every, 3),
            "one_copy_one_thread_vs_reference": round(one / every, 3),
        })
    out = {"command": "python scripts/memcpy_threads.py " + " ".join(sys.argv[1:]), "provenance": prov,
           "memcpy/bytes": nbytes,
           "memcpy/reps": a.reps, "memcpy/cores": cores, "memcpy/rounds": rounds}
    for k in rounds[0]:
        out[f"memcpy/{k}_range"] = [min(r[k] for r in rounds), max(r[k] for r in rounds)]
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
