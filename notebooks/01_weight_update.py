# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Weight update: trainer → engine
#
# Build the workbench (a Megatron-core trainer and an SGLang engine as Ray actors), train a few steps so the
# trainer's weights move away from the engine's, push them with the chosen transport and bucket size, verify
# the engine now holds exactly the trainer's weights, and look at where the time went, phase by phase. Each
# transport syncs twice: the first (cold) sync plans and allocates its buffers once; the second (warm) one is
# what an RL loop pays at every step.
#
# Headless: `labkit notebook run 01_weight_update -p TRANSPORT distributed -p BUCKET_MB 0.25`.

# %%
from labkit.workbench import nb

nb.env_report();

# %% tags=["parameters"]
STEPS = 3  # training steps before the sync
TRANSPORT = "colocated"  # per-tensor | colocated | distributed
BUCKET_MB = 1.0  # bucket size in MiB (ignored by per-tensor)
VERIFY = "checksum"  # checksum | full (an atomic sync refuses none)
BASELINE = True  # also sync per-tensor first, to compare against
PEER = True  # also sync by SGLang's stock loader (the field's method: verl, slime), the same transport and buckets
INTERACTIVE = False  # True in JupyterLab: transport/bucket controls and a Run button

# %% tags=["validate"]
from labkit.sync.config import SyncConfig

nb.check_params(globals(), {
    "STEPS": nb.Int(0, 200), "TRANSPORT": nb.Choice.of(SyncConfig, "transport"),
    "BUCKET_MB": nb.Float(0.001, 1024), "VERIFY": nb.Choice.of(SyncConfig, "verify", exclude=("none",)),
    "BASELINE": nb.Bool(), "PEER": nb.Bool(), "INTERACTIVE": nb.Bool()});

# %%
from labkit.workbench import experiments as ex
from labkit.workbench import viz
from labkit.sync import SyncConfig
from labkit.workbench import Workbench

wb = Workbench()
nb.record(wb.timings)

# %%
history = wb.train(STEPS)
nb.record({"train/loss": history[-1]["train/loss"], "mtp/loss": history[-1]["mtp/loss"]} if history else {})

# %%
baseline = ex.cold_and_warm(wb, SyncConfig(transport="per-tensor", verify=VERIFY)) if BASELINE else ()
nb.record({"baseline/timing/sync/total": baseline[1]["timing/sync/total"]} if baseline else {})

# %%
peer = ex.peer_sync(wb, SyncConfig(transport=TRANSPORT, bucket_mb=BUCKET_MB, verify=VERIFY)) if PEER else ()
nb.record({"peer/timing/sync/total": peer[1]["timing/sync/total"]} if peer else {})

# %%
cold, m = ex.cold_and_warm(wb, SyncConfig(transport=TRANSPORT, bucket_mb=BUCKET_MB, verify=VERIFY))
nb.record({**m, "cold/timing/sync/total": cold["timing/sync/total"],
           "cold/timing/sync/setup": cold["timing/sync/setup"]})
print(f"verified={m['sync/verified']}  version={m['sync/weight_version']}  {m['sync/num_buckets']} buckets  "
      f"{m['sync/bytes'] / 2**20:.2f} MiB in {m['timing/sync/total']:.3f} s")

# %%
greedy = wb.compare_greedy()
nb.record(greedy.metrics)
greedy.samples[:3]

# %%
nb.show(viz.sync_phases([*baseline, *peer, cold, m]), name="sync_phases", interactive=INTERACTIVE)

# %%
if INTERACTIVE:
    from labkit.workbench.widgets import sync_explorer

    explorer = sync_explorer(wb, value_mb=BUCKET_MB)

# %%
if not INTERACTIVE:  # interactive sessions keep the workbench for the controls above
    from labkit.cluster import runtime

    wb.close()
    runtime.shutdown()
