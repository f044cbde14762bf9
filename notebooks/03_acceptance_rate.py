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
# step) in three arms from the same checkpoint, seeds, prompts and rollouts (per-request sampling seeds), over
# several seeds (mean and 95 % band):
#
# - **frozen**: the MTP layer is not trained; everything is synced;
# - **trained**: the MTP loss on the response tokens, trunk detached; everything is synced;
# - **unsynced**: trained, but the syncs leave the draft layers out; the engine's draft stays as at step 0 and is
#   read back from the engine for the measurement.
#
# Options compare what the draft learns (`MTP_TARGET`) and when: every step, every N-th sync (`DRAFT_SYNC_EVERY`),
# once its acceptance has dropped (`DRAFT_SYNC_MARGIN`, verl-SpeCo), or before RL only (`PRE_RL_STEPS` > 0 with
# ARMS `frozen`, Bebop). Sweep one over seeds headless:
# `labkit notebook sweep 03_acceptance_rate --over MTP_TARGET -p MTP_TARGET tokens,policy,topk,tv -p ARMS trained`.
#
# `TASK = "chain"` runs the long-answer task (134-character worked Fibonacci chains, its own checkpoint
# data/tiny-mimo-chain): acceptance by position within the generation, in bins of 32 tokens, is drawn per arm.
#
# Acceptance is measured on the task's held-out problems (never drawn by pretraining or RL). With `SPEC = "engine"`
# (the default) it comes from SGLang's own speculative decoding: a second engine, started with the MTP layer as its
# draft and synced like the rollout engine, reports its counters per weight version (on CPU through
# `labkit.compat.spec_cpu`); labkit's speculative decoder (`labkit.mtp.speculative`, verified with rejection
# sampling) runs beside it (`mtp/loop_*`), and a greedy cross-check compares the two every step
# (`mtp/engine_vs_loop_accept_diff`). `SPEC = "loop"` measures with labkit's decoder alone. The RL step's own
# teacher-forced forward gives the offline estimate `E[sum_x min(p, q)]` (dotted lines).

# %%
from labkit.workbench import nb

nb.env_report();

# %% tags=["parameters"]
ARMS = "frozen,trained,unsynced"  # comma list
STEPS = 60  # RL steps per arm
SPEC_K = 2  # chained drafts per verify for the standalone run (answers are 2 digits + EOS: 2 is the most that count)
K = 1  # draft tokens per verify in the RL arms (MiMo's recipe: 1)
TEMPERATURE = 1.0  # speculative sampling temperature (the rollout temperature)
EVAL_PROMPTS = 256  # held-out prompts for the acceptance measurement (the task holds out 256)
PROMPTS = 64  # prompts per RL step
GROUP = 4  # samples per prompt (GRPO group)
MTP_LR_MULT = 5.0  # the draft's learning rate over the policy's
MTP_TARGET = "tokens"  # the draft's objective: tokens (sampled-token CE), policy (KL), topk (SkyRL), tv (Bebop)
DRAFT_SYNC_EVERY = 1  # cadence: the draft rides along every N-th sync
DRAFT_SYNC_MARGIN = 0.0  # cadence: the draft rides along once its acceptance EMA fell this far (0: off)
PRE_RL_STEPS = 0  # MTP-only steps on the initial policy's rollouts before RL (Bebop); with ARMS "frozen": pre-RL only
SEED = 0  # the standalone run's sampling seed
SEEDS = "0,1,2"  # one run of every arm per seed
SPEC = "engine"  # where acceptance is measured: engine (SGLang's counters, labkit's loop beside) or loop
TASK = "arith"  # arith (3-token sums) or chain (134-character answers: acceptance by position)
QUICK = False  # a few seconds per step, one seed: the numbers mean little
INTERACTIVE = False

# %% tags=["validate"]
from labkit.config import TrainConfig
from labkit.mtp.experiment import ExperimentConfig

nb.check_params(globals(), {
    "ARMS": nb.Subset.of(ExperimentConfig, "arms"), "STEPS": nb.Int(1, 500), "SPEC_K": nb.Int(1, 8), "K": nb.Int(1, 8),
    "TEMPERATURE": nb.Float(0.0, 2.0), "EVAL_PROMPTS": nb.Int(1, 256), "PROMPTS": nb.Int(1, 512),
    "GROUP": nb.Int(2, 64), "MTP_LR_MULT": nb.Float(0.01, 100.0),
    "MTP_TARGET": nb.Choice.of(TrainConfig, "mtp_target"), "DRAFT_SYNC_EVERY": nb.Int(1, 500),
    "DRAFT_SYNC_MARGIN": nb.Float(0.0, 0.99),
    "PRE_RL_STEPS": nb.Int(0, 500), "SEED": nb.Int(0), "SEEDS": nb.Ints(),
    "SPEC": nb.Choice.of(ExperimentConfig, "spec"), "TASK": nb.Choice.of(ExperimentConfig, "task"),
    "QUICK": nb.Bool(), "INTERACTIVE": nb.Bool()});

# %% [markdown]
# First, speculative decoding with the shipped checkpoint's own MTP draft (no RL): `SPEC_K` chained drafts per
# verify, rejection sampling at `TEMPERATURE`, counters as SGLang names them.

# %%
from labkit.workbench import viz
from labkit.mtp import experiment

spec = experiment.speculate(k=SPEC_K, temperature=TEMPERATURE, prompts=16 if QUICK else EVAL_PROMPTS, seed=SEED,
                            task=TASK)
nb.record({f"spec/{k.split('/', 1)[1]}": v for k, v in spec["metrics"].items()})

# %%
nb.show(viz.per_position(spec["metrics"]), name="per_position", interactive=INTERACTIVE)

# %% [markdown]
# Then the RL arms.

# %%
base = experiment.ExperimentConfig.quick() if QUICK else experiment.ExperimentConfig()
cfg = experiment.with_overrides(base, arms=tuple(a.strip() for a in ARMS.split(",")), k=K,
                                spec_temperature=TEMPERATURE, pre_rl_steps=PRE_RL_STEPS, spec=SPEC, task=TASK,
                                **({} if QUICK else dict(
                                    seeds=tuple(int(s) for s in SEEDS.split(",")),
                                    steps=STEPS, eval_prompts=EVAL_PROMPTS, prompts=PROMPTS, group=GROUP,
                                    mtp_lr_mult=MTP_LR_MULT, mtp_target=MTP_TARGET,
                                    draft_sync_every=DRAFT_SYNC_EVERY, draft_sync_margin=DRAFT_SYNC_MARGIN)))
cfg

# %%
result = experiment.run(cfg)
nb.record({k: v for k, v in result["metrics"].items() if k != "mtp/arms"})

# %%
nb.show(viz.acceptance(result["history"]), name="acceptance", interactive=INTERACTIVE)

# %%
from labkit.workbench import viz_positions

nb.show(viz_positions.by_position(result["metrics"]), name="by_position", interactive=INTERACTIVE)

# %%
import pandas as pd

cols = ["arm", "seed", "step", "mtp/accept_rate", "mtp/loop_accept_rate", "mtp/engine_vs_loop_accept_diff",
        "mtp/offline_accept_rate", "mtp/accept_length", "train/reward", "train/accuracy", "mtp/loss",
        "train/rollout_kl", "sync/verified", "mtp/draft_verified"]
pd.DataFrame(result["history"]).reindex(columns=cols)

# %%
from labkit.cluster import runtime

runtime.shutdown()
