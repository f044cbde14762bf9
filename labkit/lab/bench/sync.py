"""`labkit bench sync` and `labkit tune`: sync speed and memory on a model big enough to matter on a CPU box.

Every figure is measured in the same run as its references: the per-tensor baseline (verl before PR #2418), the
bucketed transports, the one-copy `direct`, and what this box allows (labkit.lab.bench.reference: copies, a hash
and a loopback broadcast timed in the trainer's own process). Two numbers per transport:
- transport-only (`transport_seconds`): a warm sync without verification and without the atomic guard, every
  per-sync cost included (plan replay, buffers, the session's begin/end calls, the version tag); after each one,
  outside the timer, the engine's checksums are compared with the trainer's export, and a timed sync that does not
  match fails the bench (`bench/transport_only_verified`). Without the guard the colocated transport packs into a
  /dev/shm pool, not into the guard's staging file: a path of its own, named in `bench/paths`;
- end to end: what a caller of `sync()` waits for with the defaults (atomic guard, checksum verification).
A headline over the first alone flatters. Transports are interleaved, the order rotated each round; medians are
what the tables show, best and every sample are stored beside them.
"""

from __future__ import annotations

import time
from pathlib import Path

from labkit.config import ModelSpec
from labkit.engine.config import EngineConfig
from labkit.lab.bench import reference
from labkit.lab.bench.sync_summary import summary, transport_seconds
from labkit.models.families import model_dir_for
from labkit.models.tiny import BENCH_SPEC, QUICK_SPEC, make_tiny_mimo  # noqa: F401 (the CLI's names)
from labkit.lab.bench import tune as tn
from labkit.sync.config import MB, SyncConfig
from labkit.workbench.core import Workbench

TRANSPORTS = ("per-tensor", "colocated", "distributed", "direct")
# The field's own method, same run, same model, same engine, same rounds: SGLang's stock update path as verl
# (PR #2418) and slime ship it (SyncConfig.engine_loader="sglang"): flattened buckets, one engine call each, applied
# by the model's `load_weights` (SGLang 0.5.23, sglang/srt/model_executor/model_runner_components/weight_updater.py:
# colocated, `update_weights_from_tensor(load_format="flattened_bucket")` :343-357 -> :383-411; distributed, the
# bucket broadcast by its HF names :260-278 -> :300-310, then `load_weights_from_distributed` :324-332).
PEERS = {"peer-colocated": "colocated", "peer-distributed": "distributed"}
ARMS = TRANSPORTS + tuple(PEERS)
TUNED_KEY = "timing/sync/transport_only"  # what bucket size changes; `labkit tune` and notebook 04 both tune it
PATHS = {"transport_only": "atomic=False, verify='none': colocated packs into a /dev/shm pool, the others as below; "
                           "each sync checked against the export afterwards, outside the timer",
         "end_to_end": "the defaults (atomic guard, checksum verification): colocated packs into the guard's "
                       "staging file, the rollback copy"}


def rotated(items: tuple, k: int) -> tuple:
    """`items` starting at index k (mod len): round k of an interleaved run, so no transport always goes first."""
    k %= len(items)
    return items[k:] + items[:k]


def sync_measure(wb, transport: str = "colocated", repeats: int = 2, warmup: bool = True,
                 memory_budget_mb: float | None = None, keep: list | None = None):
    """`measure(bucket_bytes) -> {"seconds", "metric", "peak_extra_bytes"}` for `labkit.lab.bench.tune`, by real syncs.

    The one measure both tuners use (`labkit tune` and notebook 04): two tuners reading different quantities
    pick different sizes for the same model. "seconds" is the best of `repeats` syncs' transport-only time
    (`TUNED_KEY`, `transport_seconds`, added to each sync's metrics), without verification and without the atomic
    guard (its host copy and checksums are not the transport). The first sync at a new size re-plans and
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
            m[TUNED_KEY] = round(transport_seconds(m), 6)
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


def _workbench(model: ModelSpec | str, workdir: str | Path, engine_dtype: str | None = None):
    """The Workbench of a bench; `engine_dtype` None: the Workbench's default engine (float32, bf16 for FP8)."""
    model_dir = bench_model_dir(model, workdir)
    if engine_dtype is None:
        return Workbench(model_dir)
    return Workbench(model_dir, engine_cfg=EngineConfig(model_dir=model_dir, dtype=engine_dtype,
                                                        max_total_tokens=4096, mem_fraction_static=0.05))


def bench_sync(spec: ModelSpec | str = BENCH_SPEC, bucket_mb: float = 32.0, reps: int = 3,
               workdir: str | Path = "runs/bench", progress: bool = True, engine_dtype: str | None = None) -> dict:
    """Per-tensor vs the bucketed transports and the one-copy `direct`, `reps` rounds of each, transport-only
    and end to end (module docstring), with this box's references and bounds measured in the same run.

    Unguarded syncs before guarded ones: an unguarded sync moves the engine past the guard's last good copy, and
    the next guarded sync would read the whole model back first. Inside each block one warm-up per transport,
    then `reps` rounds, each in a rotated order; the trainer keeps a plan per bucket size (labkit.sync.session),
    so interleaving replays plans instead of re-planning. One training step precedes every timed sync, so each
    moves changed weights. `bench/verified`: every timed sync matched the export (transport-only: checked after
    it; end to end: its own verification) AND the engine's checksums moved over the run."""
    from tqdm.auto import tqdm

    with _workbench(spec, workdir, engine_dtype) as wb:
        startup = wb.timings["timing/startup"]
        before = wb.engine.checksums()
        bar = tqdm(total=2 * len(ARMS) * (1 + reps), desc="bench sync", disable=not progress)
        fast = _block(wb, dict(bucket_mb=bucket_mb, verify="none", progress=False, atomic=False), reps, bar, True)
        full = _block(wb, dict(bucket_mb=bucket_mb, progress=False), reps, bar, False)
        bar.close()
        after = wb.engine.checksums()
    nbytes = fast["syncs"]["colocated"][0]["sync/bytes"]
    rates = fast["rates"] + full["rates"]
    gloo = reference.gloo_gbps(nbytes)
    out = {"bench/startup_s": startup, "bench/paths": PATHS,
           "bench/order": f"interleaved, rotated each round ({reps} rounds per block); unguarded block first"}
    out.update(summary(fast["syncs"], full["syncs"], rates, gloo, reference.bounds, PEERS))
    out.update(verdict(fast["checked"] + full["checked"], before, after))
    out["bench/transport_only_verified"] = bool(fast["checked"]) and all(fast["checked"])
    return out


def _block(wb, kw: dict, reps: int, bar, check: bool) -> dict:
    """One warm-up per transport, then `reps` rotated rounds of timed syncs under `kw`; after each round the
    trainer process's copy and hash rates (labkit.lab.bench.reference)."""
    syncs: dict[str, list[dict]] = {t: [] for t in ARMS}
    checked, rates = [], []
    for t in ARMS:
        wb.sync(arm_config(t, kw))  # plan, buffers, the engine's copy plan; the guard's first copy
        bar.update()
    for r in range(reps):
        for t in rotated(ARMS, r):
            wb.train(1, progress=False)
            t0 = time.perf_counter()
            m = wb.sync(arm_config(t, kw))
            m["timing/sync/wall"] = time.perf_counter() - t0
            checked.append(engine_matches_export(wb) if check else m["sync/verified"] is True)
            syncs[t].append(m)
            bar.update()
        rates.append(reference.in_trainer(wb.trainer, m["sync/bytes"]))
    return {"syncs": syncs, "checked": checked, "rates": rates}


def arm_config(arm: str, kw: dict) -> SyncConfig:
    """A labkit transport, or a peer arm: the same transport with SGLang's stock loader (PEERS)."""
    if arm in PEERS:
        return SyncConfig(transport=PEERS[arm], engine_loader="sglang", **kw)
    return SyncConfig(transport=arm, **kw)


def engine_matches_export(wb) -> bool:
    """The engine's checksums equal the trainer's export in the engine's layout and dtype (what a verified sync
    checks, done here after the fact for a sync timed without verification)."""
    from labkit.engine import checksum as ck
    from labkit.engine.contract import ffn_padding
    from labkit.sync import bucket as bk
    from labkit.sync import quantize
    from labkit.sync import verify as vf
    from labkit.sync.spec import engine_spec, sharding_of

    e = wb.engine
    spec = engine_spec(e.cfg.model_dir, e.cfg.dtype, ffn_padding(e.device, e.tp_size))
    named = wb.trainer.export()
    if spec.get("quant"):  # a block-FP8 engine holds the export quantized (labkit.sync.quantize)
        named = quantize.on_the_way(iter(named), spec["tensors"], spec["quant"])
    named = {n: t.to(bk.torch_dtype(spec["tensors"][n][1])) for n, t in named}
    expected = vf.expected_checksums(named, spec.get("ffn_pad", 1), spec.get("checksum", ck.DEFAULT),
                                     sharding_of(e.cfg.model_dir, e.tp_size, e.device))
    return vf.compare(expected, e.checksums())["sync/verified"] is True


def verdict(verified: list[bool], before: dict[str, str], after: dict[str, str]) -> dict:
    """`bench/verified`: every timed sync verified bitwise AND the engine's checksums moved. A sync of bytes the
    engine already holds verifies trivially: that alone proves nothing."""
    changed = sum(after.get(n) != c for n, c in before.items())
    return {"bench/engine_tensors_changed": changed, "bench/engine_tensors": len(before),
            "bench/verified": bool(verified) and all(verified) and changed > 0}


def tune(spec: ModelSpec | str = BENCH_SPEC, transport: str = "colocated", lo_mb: float = 0.5, hi_mb: float = 256.0,
         memory_budget_mb: float = 512.0, max_trials: int = 6, workdir: str | Path = "runs/tune",
         progress: bool = True) -> dict:
    """Sweep log-spaced bucket sizes under the memory budget, then let the autotuner find one in <= max_trials.

    Both minimise the transport-only time (`TUNED_KEY`, `sync_measure`), as notebook 04 does."""
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
