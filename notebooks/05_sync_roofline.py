# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Sync roofline: what a sync would cost on GPUs
#
# A CPU box cannot time a 1-trillion-parameter sync, but it can count what one carries and what the links allow.
# From a model's config.json alone (a shipped real config, labkit's tiny MiMo, or any `config.json` path)
# `labkit.lab.roofline.bounds` enumerates every tensor a sync moves (HF names, shapes, bf16 or block FP8), and for a
# GPU profile gives each transport's **bound**: the time no sync over it can beat, set by the one link every byte
# crosses (colocated CUDA IPC: one HBM copy per byte; NVLink broadcast; a single-NIC RDMA broadcast; all-ranks
# P2P over min(sender NICs, receiver NICs)). The **predicted** time adds the per-bucket and per-tensor costs
# labkit measured on its own syncs: on a 2-core CPU box (`labkit bench sync`, notebook 04), so they say how
# software overhead scales with tensor and bucket counts, not what a GPU pays. They are parameters
# (`labkit.lab.roofline.bounds.Overheads`): plug in your GPU's.
#
# Then the published systems beside their limits (how far each is from its transport's bound), and a what-if
# over bucket size at scale beside the CPU curve it extrapolates from. Nothing here starts Ray, a trainer or an
# engine.
#
# Headless: `labkit notebook run 05_sync_roofline -p MODEL kimi-k2 -p WEIGHTS fp8 -p HARDWARE H20`.

# %%
from labkit.workbench import nb

nb.env_report();

# %% tags=["parameters"]
MODEL = "qwen3-30b-a3b"  # moonlight-16b-a3b | qwen3-30b-a3b | deepseek-v3 | kimi-k2 | tiny | quick | bench | a path
WEIGHTS = "bf16"  # bf16 | fp8 (block FP8 projections + float32 scales) | fp32
MTP = True  # count the model's MTP layers (DeepSeek-V3 has one; the draft rides along in labkit's syncs)
HARDWARE = "H100"  # H100 | H200 | H20
TRAINER_GPUS = 8  # GPUs holding the trainer's weights (senders)
ENGINE_GPUS = 8  # GPUs of all engine replicas (receivers)
ENGINE_TP = 8  # GPUs per engine replica
BROADCAST_NICS = 1  # NICs per node an inter-node broadcast is striped over (1: single-NIC funnel)
BUCKET_MB = 512.0  # bucket size (MiB) for the tables
MIN_MB = 1.0  # what-if: smallest bucket (MiB)
MAX_MB = 8192.0  # what-if: largest bucket (MiB)
INTERACTIVE = False  # True in JupyterLab: model / weights / hardware / bucket controls with a Run button

# %% tags=["validate"]
from labkit.lab.roofline import bounds as rf

nb.check_params(globals(), {
    "MODEL": nb.Str(), "WEIGHTS": nb.Choice.of(rf.Scenario, "weights"), "MTP": nb.Bool(),
    "HARDWARE": nb.Choice.of(rf.Scenario, "hardware"), "TRAINER_GPUS": nb.Int(1, 100000),
    "ENGINE_GPUS": nb.Int(1, 100000), "ENGINE_TP": nb.Int(1, 4096), "BROADCAST_NICS": nb.Int(1, 64),
    "BUCKET_MB": nb.Float(0.001, 65536), "MIN_MB": nb.Float(0.001, 65536), "MAX_MB": nb.Float(0.001, 65536),
    "INTERACTIVE": nb.Bool()});
scenario = rf.Scenario(model=MODEL, weights=WEIGHTS, mtp=MTP, hardware=HARDWARE, bucket_mb=BUCKET_MB,
                       layout=rf.Layout(trainer_gpus=TRAINER_GPUS, engine_gpus=ENGINE_GPUS, engine_tp=ENGINE_TP,
                                        broadcast_nics=BROADCAST_NICS))
if MIN_MB > MAX_MB:
    raise ValueError(f"MIN_MB={MIN_MB!r} is invalid: expected <= MAX_MB={MAX_MB!r}")

# %% [markdown]
# The overheads, fitted from labkit's stored CPU runs (the arithmetic is printed): per bucket, the slope of
# weight-moving time against bucket count over the sizes that hold every fused group; per tensor, what the MoE
# preset's extra tensors add over the bench model once each run's two copies of the bytes are paid; per sync, what
# is left of the bench model's time; per call of the per-tensor transport, its time less one copy, per tensor.

# %%
from labkit.lab.roofline import notebook as rn

over = rn.overheads()

# %% [markdown]
# Each transport's bound for this model and layout, and the predicted time (bound + overheads at `BUCKET_MB`).
# The last row is the per-tensor baseline: one engine call per tensor.

# %%
rn.show_rows(rn.transport_table(scenario, over), name="transport_bounds", title="Transport bounds")

# %% [markdown]
# Published syncs beside the bound of the transport each used. Fraction of its limit = bound / published time
# (for a published rate: rate / the link's rate). Each row states what it assumes where the publication is silent.

# %%
rn.show_rows(rn.published_table(), name="published_systems", title="Published systems")

# %% [markdown]
# What-if for bucket size at scale: left, the predicted time per transport (bounds dashed, `BUCKET_MB` dotted);
# right, the CPU-measured curve the overheads come from (notebook 04, the 317 MB bench model) and the fitted line.

# %%
nb.show(rn.whatif_figure(scenario, over, MIN_MB, MAX_MB), name="bucket_whatif", interactive=INTERACTIVE)

# %%
if INTERACTIVE:
    controls = rn.explorer(scenario, over, MIN_MB, MAX_MB)
