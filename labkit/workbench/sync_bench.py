"""`labkit bench sync` and `labkit tune`: sync speed and memory on a model big enough to matter on a CPU box.

All ratios are measured in the same run: the per-tensor baseline (verl before PR #2418), the bucketed
transports, and a plain memory copy of the same bytes as the physical reference. Timed syncs run without
verification (it is its own phase); one verified sync closes the run so the numbers are of a correct sync.
"""

from __future__ import annotations

import time
from pathlib import Path

from labkit.config import ModelSpec
from labkit.models.tiny import BENCH_SPEC, QUICK_SPEC, make_tiny_mimo  # noqa: F401 (the CLI's names)
from labkit.sync import tune as tn
from labkit.sync.config import MB, SyncConfig
from labkit.workbench.core import Workbench



def memcpy_gbps(nbytes: int, reps: int = 5) -> float:
    """Best-of-`reps` copy of `nbytes` between two preallocated CPU (or GPU) buffers."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if dev == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


TUNED_KEY = "timing/sync/weight_moving"  # what bucket size changes; `labkit tune` and notebook 04 both tune it


def weight_moving_seconds(m: dict) -> float:
    """Weight-moving wall time of a warm sync: the sync minus verification, one-off setup (plan, buffers), and the
    session's fixed calls (begin/end, prefix-cache flush, version tag), which are the same for every transport and
    bucket size and reported on their own (bench/session_seconds). This is the quantity a bucket size changes."""
    return (m["timing/sync/total"] - m["timing/sync/verify"] - m["timing/sync/session"]
            - m.get("timing/sync/setup", 0.0))


_seconds = weight_moving_seconds


def sync_measure(wb, transport: str = "colocated", repeats: int = 2, warmup: bool = True,
                 memory_budget_mb: float | None = None, keep: list | None = None):
    """`measure(bucket_bytes) -> {"seconds", "metric", "peak_extra_bytes"}` for `labkit.sync.tune`, from real syncs.

    The one measure both tuners use (`labkit tune` and notebook 04 through `labkit.workbench.experiments`): two tuners
    reading different quantities pick different sizes for the same model. "seconds" is the best of `repeats`
    syncs' weight-moving time (`TUNED_KEY`, added to each sync's metrics), without verification and without the
    atomic guard (its host copy and checksums are not the transport). The first sync at a new size re-plans and
    allocates its buffers, so `warmup` spends one unmeasured sync per size. The measured sync's full metrics are
    appended to `keep` when given (per-phase plots).
    """
    def measure(bucket_bytes: int) -> dict:
        cfg = SyncConfig(transport=transport, bucket_mb=bucket_bytes / MB, memory_budget_mb=memory_budget_mb,
                         verify="none", progress=False, atomic=False)
        if warmup:
            wb.sync(cfg)
        runs = [wb.sync(cfg) for _ in range(max(1, repeats))]
        for m in runs:
            m[TUNED_KEY] = round(weight_moving_seconds(m), 6)
        best = min(runs, key=lambda m: m[TUNED_KEY])
        if keep is not None:
            keep.append(best)
        return {"seconds": best[TUNED_KEY], "metric": TUNED_KEY,
                "peak_extra_bytes": max(m["sync/peak_extra_bytes"] for m in runs)}

    return measure


def _workbench(spec: ModelSpec, workdir: str | Path):
    return Workbench(str(make_tiny_mimo(Path(workdir) / "bench-model", spec)))


def bench_sync(spec: ModelSpec = BENCH_SPEC, bucket_mb: float = 32.0, reps: int = 3,
               workdir: str | Path = "runs/bench", progress: bool = True) -> dict:
    from tqdm.auto import tqdm

    out: dict = {}
    with _workbench(spec, workdir) as wb:
        out["bench/startup_s"] = wb.timings["timing/startup"]
        runs = {"per-tensor": 1, "colocated": reps, "distributed": reps}
        best: dict[str, dict] = {}
        bar = tqdm(total=sum(runs.values()) + 1, desc="bench sync", disable=not progress)
        # Warm-up: plans, shared-memory buffers and the engine's first load are paid once, outside the timings.
        # atomic=False: the transport itself, without the guard's host copy and checksums (labkit.sync.atomic)
        wb.sync(SyncConfig(transport="colocated", bucket_mb=bucket_mb, verify="none", progress=False, atomic=False))
        bar.update()
        for transport, n in runs.items():
            for _ in range(n):
                m = wb.sync(SyncConfig(transport=transport, bucket_mb=bucket_mb, verify="none", progress=False,
                                       atomic=False))
                if transport not in best or _seconds(m) < _seconds(best[transport]):
                    best[transport] = m
                bar.update()
        bar.close()
        final = wb.sync(SyncConfig(transport="colocated", bucket_mb=bucket_mb, verify="checksum", progress=False))
    nbytes = best["colocated"]["sync/bytes"]
    mem = memcpy_gbps(nbytes)
    gbps = {t: nbytes / _seconds(m) / 1e9 for t, m in best.items()}
    bucketed = min(_seconds(best["colocated"]), _seconds(best["distributed"]))
    out.update({
        "bench/model_bytes": nbytes,
        "bench/num_tensors": best["colocated"]["sync/num_tensors"],
        "bench/bucket_bytes": best["colocated"]["sync/bucket_bytes"],
        "bench/num_buckets": best["colocated"]["sync/num_buckets"],
        "bench/largest_tensor_bytes": best["colocated"]["sync/largest_tensor_bytes"],
        "bench/peak_extra_bytes": max(best["colocated"]["sync/peak_extra_bytes"],
                                      best["distributed"]["sync/peak_extra_bytes"]),
        "bench/session_seconds": round(best["colocated"]["timing/sync/session"], 4),
        "bench/per_tensor_seconds": round(_seconds(best["per-tensor"]), 4),
        "bench/colocated_seconds": round(_seconds(best["colocated"]), 4),
        "bench/distributed_seconds": round(_seconds(best["distributed"]), 4),
        "bench/speedup_bucketed_vs_per_tensor": round(_seconds(best["per-tensor"]) / bucketed, 2),
        "bench/per_tensor_gbps": round(gbps["per-tensor"], 4),
        "bench/colocated_gbps": round(gbps["colocated"], 4),
        "bench/distributed_gbps": round(gbps["distributed"], 4),
        "bench/memcpy_gbps": round(mem, 4),
        "bench/colocated_vs_memcpy": round(gbps["colocated"] / mem, 4),
        "bench/distributed_vs_memcpy": round(gbps["distributed"] / mem, 4),
        "bench/verified": final["sync/verified"],
        "bench/phases": {t: {k.removeprefix("timing/sync/"): v for k, v in m.items() if k.startswith("timing/sync/")}
                         for t, m in best.items()},
    })
    b, L = out["bench/bucket_bytes"], out["bench/largest_tensor_bytes"]
    out["bench/peak_within_contract"] = out["bench/peak_extra_bytes"] <= 2 * b + L
    return out


def tune(spec: ModelSpec = BENCH_SPEC, transport: str = "colocated", lo_mb: float = 0.5, hi_mb: float = 256.0,
         memory_budget_mb: float = 512.0, max_trials: int = 6, workdir: str | Path = "runs/tune",
         progress: bool = True) -> dict:
    """Sweep log-spaced bucket sizes under the memory budget, then let the autotuner find one in <= max_trials.

    Both minimise the weight-moving time (`TUNED_KEY`, `sync_measure`), as notebook 04 does."""
    sizes = tn.candidates(int(lo_mb * MB), int(hi_mb * MB), int(memory_budget_mb * MB))
    with _workbench(spec, workdir) as wb:
        measure = sync_measure(wb, transport, repeats=2, memory_budget_mb=memory_budget_mb)
        t0 = time.perf_counter()
        curve = tn.sweep(measure, sizes, progress=progress)
        t_sweep = time.perf_counter() - t0
        auto = tn.autotune(measure, sizes, max_trials=max_trials)
        t_auto = time.perf_counter() - t0 - t_sweep
    best = min(curve, key=lambda c: c["seconds"])
    return {
        "tune/transport": transport,
        "tune/metric": TUNED_KEY,
        "tune/memory_budget_bytes": int(memory_budget_mb * MB),
        "tune/best_bucket_bytes": auto["best_bucket_bytes"],
        "tune/best_seconds": round(auto["best_seconds"], 5),
        "tune/trials": len(auto["trials"]),
        "tune/trial_log": auto["trials"],
        "tune/sweep_best_bucket_bytes": best["bucket_bytes"],
        "tune/sweep_best_seconds": round(best["seconds"], 5),
        "tune/autotune_vs_sweep": round(auto["best_seconds"] / best["seconds"], 4),
        "tune/pick_vs_sweep_best": round(tn.pick_vs_best(curve, auto["best_bucket_bytes"]), 4),
        "tune/curve": curve,
        "timing/tune/sweep": round(t_sweep, 2),
        "timing/tune/autotune": round(t_auto, 2),
    }
