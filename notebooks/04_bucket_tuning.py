# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Bucket size: sweep and autotune
#
# Small buckets pay a per-bucket cost (on a GPU one engine call each); large ones lose the pack/load overlap and
# cost memory (two buckets are in flight, so the budget admits buckets up to half of it). On a GPU the two meet
# in a U. On the CPU default a colocated sync is one engine call (`labkit.engine.inside.ring`), so the curve
# falls only while tensors larger than a bucket travel alone, then stays flat within noise (16 to 256 MiB buckets
# of the 303 MB `bench` model, `data/notebook04_bench_cpu.json`): there any size under the budget will do. We
# sweep log-spaced sizes under the budget with real syncs, let the autotuner (a discrete golden-section search)
# pick one in a few trials, then sync once more at the chosen size and verify it.
#
# The tuned quantity is the **transport-only time** (`timing/sync/transport_only`): a warm sync's wall time less
# verification, without the atomic guard, with the per-sync costs every warm sync pays (plan replay, session
# calls) counted. `labkit tune` measures it with the same function (`labkit.lab.bench.sync.sync_measure`), so
# the notebook and the command pick the same size for the same model.
# `tune/pick_vs_sweep_best` is the sweep's time at the tuner's pick over the sweep's best (1.0: it found the best).
#
# The default model is `quick` (16 MB, the tiny family scaled up, random weights): on the shipped 2.5 MB
# checkpoint the whole model fits one small bucket and there is little to tune.

# %%
from labkit.workbench import nb

nb.env_report();

# %% tags=["parameters"]
MODEL = "quick"  # tiny (the shipped checkpoint) | quick | bench (labkit.models.tiny.SIZES)
TRANSPORT = "colocated"  # colocated | distributed (per-tensor has no buckets)
MIN_MB = 0.0625  # smallest bucket (MiB)
MAX_MB = 32.0  # largest bucket (MiB)
MEMORY_BUDGET_MB = 64.0  # refuse buckets whose double-buffered footprint exceeds this
PER_OCTAVE = 1  # sizes per doubling
REPEATS = 2  # syncs per measurement (best of)
MAX_TRIALS = 6  # autotune budget (labkit tune's default)
STEPS = 1  # training steps first, so every sync moves real, changed weights
INTERACTIVE = False

# %% tags=["validate"]
from labkit.models import tiny
from labkit.sync.config import SyncConfig

nb.check_params(globals(), {
    "MODEL": nb.Choice(*tiny.SIZES), "TRANSPORT": nb.Choice.of(SyncConfig, "transport", exclude=("per-tensor",)),
    "MIN_MB": nb.Float(0.001, 1024), "MAX_MB": nb.Float(0.001, 4096), "MEMORY_BUDGET_MB": nb.Float(0.002, 65536),
    "PER_OCTAVE": nb.Int(1, 4), "REPEATS": nb.Int(1, 20), "MAX_TRIALS": nb.Int(1, 32), "STEPS": nb.Int(0, 100),
    "INTERACTIVE": nb.Bool()});
if MIN_MB > MAX_MB:
    raise ValueError(f"MIN_MB={MIN_MB!r} is invalid: expected <= MAX_MB={MAX_MB!r}")

# %%
from labkit.lab.bench import sync as bench
from labkit.lab.bench import tune
from labkit.workbench import viz
from labkit.sync import SyncConfig
from labkit.workbench import Workbench

MB = 2**20
sizes = tune.candidates(int(MIN_MB * MB), int(MAX_MB * MB), int(MEMORY_BUDGET_MB * MB), per_octave=PER_OCTAVE)
print(len(sizes), "sizes:", [viz.fmt_bytes(s) for s in sizes])

# %%
wb = Workbench(tiny.sized_model_dir(MODEL))
wb.train(STEPS)
nb.record(wb.timings)

# %%
phases = []
measure = bench.sync_measure(wb, TRANSPORT, repeats=REPEATS, memory_budget_mb=MEMORY_BUDGET_MB, keep=phases)
curve = tune.sweep(measure, sizes)

# %%
best = tune.autotune(bench.sync_measure(wb, TRANSPORT, repeats=REPEATS, memory_budget_mb=MEMORY_BUDGET_MB), sizes,
                     max_trials=MAX_TRIALS)
nb.record({"tune/metric": bench.TUNED_KEY, "tune/best_bucket_bytes": best["best_bucket_bytes"],
           "tune/pick_vs_sweep_best": round(tune.pick_vs_best(curve, best["best_bucket_bytes"]), 4),
           "tune/best_seconds": best["best_seconds"], "tune/trials": len(best["trials"]), "tune/sizes": len(sizes),
           "tune/curve": curve})

# %%
nb.show(viz.bucket_sweep(curve, best["best_bucket_bytes"], int(MEMORY_BUDGET_MB * MB), best["trials"],
                         title=f"Bucket size ({TRANSPORT}): transport-only time and memory"), name="bucket_sweep",
        interactive=INTERACTIVE)

# %%
nb.show(viz.sync_phases(phases, title="Per-phase time per bucket size"), name="sync_phases_by_bucket",
        interactive=INTERACTIVE)

# %%
final = wb.sync(SyncConfig(transport=TRANSPORT, bucket_mb=best["best_bucket_bytes"] / MB,
                           memory_budget_mb=MEMORY_BUDGET_MB))
nb.record(final)

# %%
if INTERACTIVE:
    from labkit.workbench.widgets import sync_explorer

    explorer = sync_explorer(wb, sizes_mb=[s / MB for s in sizes], value_mb=best["best_bucket_bytes"] / MB)

# %%
if not INTERACTIVE:  # interactive sessions keep the workbench for the controls above
    from labkit.cluster import runtime

    wb.close()
    runtime.shutdown()
