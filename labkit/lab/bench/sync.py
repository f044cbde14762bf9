"""`labkit bench sync` and `labkit tune`: sync speed and memory on a model big enough to matter on a CPU box.

All ratios are measured in the same run: the per-tensor baseline (verl before PR #2418), the bucketed
transports, and a plain memory copy of the same bytes as the physical reference. Two numbers per transport:
transport-only (the weight-moving time, what bucket size and transport change) and end to end (what a caller of
`sync()` waits for, atomic guard and verification included): a headline over the first alone flatters.
"""

from __future__ import annotations

import time
from pathlib import Path

from labkit.config import ModelSpec
from labkit.models.families import model_dir_for
from labkit.models.tiny import BENCH_SPEC, QUICK_SPEC, make_tiny_mimo  # noqa: F401 (the CLI's names)
from labkit.sync import tune as tn
from labkit.sync.config import MB, SyncConfig
from labkit.workbench.core import Workbench



MEMCPY_MIN_BYTES = 256 << 20


def memcpy_gbps(nbytes: int, reps: int = 5) -> float:
    """Best-of-`reps` copy of `nbytes` (at least `MEMCPY_MIN_BYTES`) between two preallocated CPU (or GPU) buffers.
    The floor keeps it a memory-bandwidth reference: a copy of the 9 MB MoE preset fits in cache and reads
    anything from cache speed to a cold miss, no reference at all."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    nbytes = max(nbytes, MEMCPY_MIN_BYTES)
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


def bench_model_dir(model: ModelSpec | str, workdir: str | Path) -> str:
    """The benched model's directory: a tiny MiMo of `model`'s sizes written under `workdir`, or `model` as
    `--model` takes it (a family preset such as qwen3-moe, or an HF model directory)."""
    if isinstance(model, ModelSpec):
        return str(make_tiny_mimo(Path(workdir) / "bench-model", model))
    return model_dir_for(model)


def _workbench(model: ModelSpec | str, workdir: str | Path):
    return Workbench(bench_model_dir(model, workdir))


def bench_sync(spec: ModelSpec | str = BENCH_SPEC, bucket_mb: float = 32.0, reps: int = 3,
               workdir: str | Path = "runs/bench", progress: bool = True) -> dict:
    """Per-tensor vs the bucketed transports and the one-copy `direct`, `reps` syncs each (equal per transport),
    two ways:
    - transport-only (`bench/<transport>_seconds`, GB/s, `_vs_memcpy`): the weight-moving time of syncs without
      verification or the atomic guard (`weight_moving_seconds`);
    - end to end (`bench/end_to_end_seconds/<transport>`): the wall time a caller of `Workbench.sync()` waits
      with the defaults (atomic guard, checksum verification, session calls), and the share of it spent inside
      the engine's apply call (`bench/engine_apply_share`: SGLang's update call, begin/end excluded), the cost
      that grows with the tensor count (verl PR #6974: ~55 s of a 58 s MoE sync);
    Transports run one after another, each warmed up first (what every RL step pays, not the one-off setup).
    One training step precedes every timed sync, so each sync moves changed weights. `bench/verified` holds only
    if every end-to-end sync verified bitwise and the engine's checksums then differ from before the run.
    `bench/phases_end_to_end`: per transport, the phases of its fastest end-to-end sync (guard, rollback copy and
    verification included; `wall` is what the caller waited), so where that time goes is stored with the run."""
    from tqdm.auto import tqdm

    transports = ("per-tensor", "colocated", "distributed", "direct")
    out: dict = {}
    with _workbench(spec, workdir) as wb:
        out["bench/startup_s"] = wb.timings["timing/startup"]
        fast = dict(bucket_mb=bucket_mb, verify="none", progress=False, atomic=False)
        full = dict(bucket_mb=bucket_mb, progress=False)  # the defaults a caller of sync() gets
        before = wb.engine.checksums()
        bar = tqdm(total=len(transports) * (2 + 2 * reps), desc="bench sync", disable=not progress)
        best: dict[str, dict] = {}
        e2e: dict[str, list[float]] = {t: [] for t in transports}
        apply: dict[str, list[float]] = {t: [] for t in transports}
        e2e_runs: dict[str, dict] = {}  # the fastest end-to-end sync's metrics per transport: where its time went
        verified = []
        mem: list[float] = []  # the memcpy reference, sampled after each transport (`reference`)
        # One transport at a time, as an RL loop runs one: a trainer keeps one plan, so alternating per-tensor
        # (bucket = 1 tensor) and bucketed syncs would re-plan every time and time cold syncs only. Unguarded
        # syncs before guarded ones: an unguarded sync moves the engine past the guard's last good copy, and the
        # next guarded sync would read the whole model back first.
        for t in transports:
            for kw in (fast, full):
                wb.sync(SyncConfig(transport=t, **kw))  # warm-up: plan, buffers, the engine's copy plan; guard
                bar.update()
                for _ in range(reps):
                    wb.train(1, progress=False)
                    t0 = time.perf_counter()
                    m = wb.sync(SyncConfig(transport=t, **kw))
                    wall = time.perf_counter() - t0
                    if kw is full:
                        e2e[t].append(wall)
                        apply[t].append(m["timing/sync/load"] / wall)
                        verified.append(m["sync/verified"] is True)
                        if wall <= min(e2e[t]):
                            e2e_runs[t] = m | {"timing/sync/wall": wall}
                    elif t not in best or _seconds(m) < _seconds(best[t]):
                        best[t] = m
                    bar.update()
            mem.append(memcpy_gbps(m["sync/bytes"]))
        bar.close()
        after = wb.engine.checksums()
    out.update(reference(mem))
    out.update(_summary(best, e2e, out["bench/memcpy_gbps"]))
    out["bench/phases_end_to_end"] = {t: {k.removeprefix("timing/sync/"): round(v, 6) for k, v in m.items()
                                          if k.startswith("timing/sync/")} for t, m in e2e_runs.items()}
    out["bench/engine_apply_share"] = round(sum(apply["colocated"]) / len(apply["colocated"]), 4)
    for t, shares in apply.items():
        out[f"bench/engine_apply_share/{t}"] = round(sum(shares) / len(shares), 4)
    out.update(verdict(verified, before, after))
    return out


def reference(samples: list[float]) -> dict:
    """`bench/memcpy_gbps`: the fastest of the memcpy samples taken through the run (one after each transport, the
    engine up and idle), with every sample beside it. One sample moves every `_vs_memcpy` ratio with it; the best
    of several taken where the syncs ran is the steadier reference, and the higher one, so no ratio gains from a
    slow sample. A two-copy path (pack, apply) is bounded by about half of it: two one-thread copies at once
    against an every-core copy beside them is what scripts/memcpy_threads.py measures
    (data/memcpy_threads_cpu.json)."""
    if not samples:
        raise ValueError("memcpy reference: no samples (the bench ran no transport)")
    return {"bench/memcpy_gbps": round(max(samples), 4),
            "bench/memcpy_gbps_samples": [round(g, 4) for g in samples]}


def verdict(verified: list[bool], before: dict[str, str], after: dict[str, str]) -> dict:
    """`bench/verified`: every end-to-end sync verified bitwise AND the engine's checksums moved. A sync of bytes
    the engine already holds verifies trivially (the old bench never trained): that alone proves nothing."""
    changed = sum(after.get(n) != c for n, c in before.items())
    return {"bench/engine_tensors_changed": changed, "bench/engine_tensors": len(before),
            "bench/verified": bool(verified) and all(verified) and changed > 0}


def _summary(best: dict[str, dict], e2e: dict[str, list[float]], mem: float) -> dict:
    nbytes = best["colocated"]["sync/bytes"]
    gbps = {t: nbytes / _seconds(m) / 1e9 for t, m in best.items()}
    bucketed = min(_seconds(best["colocated"]), _seconds(best["distributed"]))
    e2e_best = {t: min(v) for t, v in e2e.items()}
    out = {
        "bench/model_bytes": nbytes,
        "bench/num_tensors": best["colocated"]["sync/num_tensors"],
        "bench/bucket_bytes": best["colocated"]["sync/bucket_bytes"],
        "bench/num_buckets": best["colocated"]["sync/num_buckets"],
        "bench/largest_tensor_bytes": best["colocated"]["sync/largest_tensor_bytes"],
        "bench/peak_extra_bytes": max(best["colocated"]["sync/peak_extra_bytes"],
                                      best["distributed"]["sync/peak_extra_bytes"]),
        "bench/session_seconds": round(best["colocated"]["timing/sync/session"], 4),
        "bench/apply_path": best["colocated"]["sync/apply_path"],
        "bench/speedup_bucketed_vs_per_tensor": round(_seconds(best["per-tensor"]) / bucketed, 2),
        "bench/speedup_end_to_end": round(e2e_best["per-tensor"] / min(e2e_best["colocated"],
                                                                       e2e_best["distributed"]), 2),
        "bench/phases": {t: {k.removeprefix("timing/sync/"): v for k, v in m.items() if k.startswith("timing/sync/")}
                         for t, m in best.items()},
    }
    for t, m in best.items():
        key = t.replace("-", "_")
        out[f"bench/{key}_seconds"] = round(_seconds(m), 4)
        out[f"bench/{key}_gbps"] = round(gbps[t], 4)
        out[f"bench/end_to_end_seconds/{t}"] = round(e2e_best[t], 4)
        out[f"bench/apply_path/{t}"] = m["sync/apply_path"]
        out[f"bench/end_to_end_seconds_all/{t}"] = [round(v, 4) for v in e2e[t]]
        if t != "per-tensor":
            out[f"bench/{key}_vs_memcpy"] = round(gbps[t] / mem, 4)
    out["bench/colocated_vs_memcpy_end_to_end"] = round(nbytes / e2e_best["colocated"] / 1e9 / mem, 4)
    if "direct" in best:  # one copy: the trainer writes into the engine's parameters (labkit.engine.inside.direct)
        out["bench/direct_vs_memcpy_end_to_end"] = round(nbytes / e2e_best["direct"] / 1e9 / mem, 4)
        out["bench/speedup_direct_vs_per_tensor"] = round(_seconds(best["per-tensor"]) / _seconds(best["direct"]), 2)
        out["bench/speedup_end_to_end/direct"] = round(e2e_best["per-tensor"] / e2e_best["direct"], 2)
    b, L = out["bench/bucket_bytes"], out["bench/largest_tensor_bytes"]
    out["bench/peak_within_contract"] = out["bench/peak_extra_bytes"] <= 2 * b + L
    # measured by the kernel (labkit.sync.memory) on the transport-only syncs (no guard: its host copy is its own)
    measured = [best[t].get("sync/peak_extra_bytes_measured") for t in ("colocated", "distributed")]
    if None not in measured:
        out["bench/peak_extra_bytes_measured"] = max(measured)
        out["bench/peak_measured_within_contract"] = max(measured) <= 2 * b + L
    return out


def tune(spec: ModelSpec | str = BENCH_SPEC, transport: str = "colocated", lo_mb: float = 0.5, hi_mb: float = 256.0,
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
