# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · MTP draft acceptance while RL moves the policy
#
# GRPO on the arithmetic task (rollouts from the SGLang engine, Megatron trainer, a weight sync after every
# step) in three arms from the same checkpoint, seeds and prompts:
#
# - **frozen**: the MTP layer is not trained; everything is synced;
# - **trained**: the MTP loss on the response tokens, trunk detached; everything is synced;
# - **unsynced**: trained, but the syncs send the trunk only; the engine's draft stays as at step 0.
#
# Every step, labkit's speculative decoder (`labkit.mtp.speculative`, the MTP head chained as the draft, verified
# by the target with rejection sampling) measures acceptance over the exported weights the engine serves; the
# RL step's own teacher-forced forward gives the offline estimate `E[sum_x min(p, q)]` (dotted lines).
# On a GPU, SGLang's speculative engine reports the same counters (`labkit.mtp.acceptance.parse_sglang_meta`).

# %%
from labkit import nb

nb.env_report();

# %% tags=["parameters"]
ARMS = "frozen,trained,unsynced"  # comma list
STEPS = 30  # RL steps per arm
K = 1  # draft tokens per verify (MiMo's recipe: 1)
TEMPERATURE = 1.0  # speculative sampling temperature (the rollout temperature)
EVAL_PROMPTS = 256  # held-out prompts for the acceptance measurement
PROMPTS = 32  # prompts per RL step
GROUP = 8  # samples per prompt (GRPO group)
SEED = 0
QUICK = False  # a few seconds per step: the numbers mean little
INTERACTIVE = False

# %% tags=["validate"]
nb.check_params(globals(), {
    "ARMS": nb.Subset("frozen", "trained", "unsynced"), "STEPS": nb.Int(1, 500), "K": nb.Int(1, 8),
    "TEMPERATURE": nb.Float(0.0, 2.0), "EVAL_PROMPTS": nb.Int(1, 4096), "PROMPTS": nb.Int(1, 512),
    "GROUP": nb.Int(2, 64), "SEED": nb.Int(0), "QUICK": nb.Bool(), "INTERACTIVE": nb.Bool()});

# %%
from labkit.mtp import experiment

base = experiment.ExperimentConfig.quick() if QUICK else experiment.ExperimentConfig()
cfg = experiment.with_overrides(base, arms=tuple(a.strip() for a in ARMS.split(",")), k=K, seed=SEED,
                                spec_temperature=TEMPERATURE, **({} if QUICK else dict(
                                    steps=STEPS, eval_prompts=EVAL_PROMPTS, prompts=PROMPTS, group=GROUP)))
cfg

# %%
result = experiment.run(cfg)
nb.record({k: v for k, v in result["metrics"].items() if k != "mtp/arms"})

# %%
from labkit import viz

nb.show(viz.acceptance(result["history"]), name="acceptance", interactive=INTERACTIVE)

# %%
import pandas as pd

cols = ["arm", "step", "mtp/accept_rate", "mtp/offline_accept_rate", "mtp/accept_length", "train/reward",
        "train/accuracy", "mtp/loss", "train/rollout_kl", "sync/verified"]
pd.DataFrame(result["history"]).reindex(columns=cols)

# %%
from labkit.cluster import runtime

runtime.shutdown()
