# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Rollouts before and after a training step
#
# The engine generates answers to arithmetic prompts (reward 1 for the exact sum). Then the trainer takes a
# few steps and the engine is synced; new rollouts come from the new `weight_version`. Log-probs of the sampled
# tokens, engine vs trainer, three times: before training (they agree), after training without a sync (the
# engine's numbers are stale: what an RL loss would see off-policy), and on the new rollouts after the sync.

# %%
from labkit.workbench import nb

nb.env_report();

# %% tags=["parameters"]
N_PROMPTS = 16  # rollouts per batch
TEMPERATURE = 0.0  # 0.0 means greedy
MAX_NEW_TOKENS = 6
STEPS = 3  # training steps between the two rollout batches
TRANSPORT = "colocated"  # per-tensor | colocated | distributed
BUCKET_MB = 1.0
PROBE = 8  # tokens per probe prompt: the sync checks the engine's behaviour against the trainer's (0: off)
SEED = 0
INTERACTIVE = False

# %% tags=["validate"]
from labkit.sync.config import SyncConfig

nb.check_params(globals(), {
    "N_PROMPTS": nb.Int(1, 512), "TEMPERATURE": nb.Float(0.0, 2.0), "MAX_NEW_TOKENS": nb.Int(1, 64),
    "STEPS": nb.Int(1, 200), "TRANSPORT": nb.Choice.of(SyncConfig, "transport"),
    "BUCKET_MB": nb.Float(0.001, 1024), "PROBE": nb.Int(0, 256), "SEED": nb.Int(0), "INTERACTIVE": nb.Bool()});

# %%
import pandas as pd

from labkit.workbench import experiments as ex
from labkit.workbench import viz
from labkit.sync import SyncConfig
from labkit.workbench import Workbench

wb = Workbench()
nb.record(wb.timings)

# %%
before = wb.rollout(N_PROMPTS, temperature=TEMPERATURE, seed=SEED, max_new_tokens=MAX_NEW_TOKENS)
nb.record({"rollout/reward_before": before.metrics["rollout/reward_mean"],
           "rollout/weight_version_before": before.metrics["rollout/weight_version"]})
pd.DataFrame(ex.table(before)).head(8)

# %%
fresh = ex.logprob_agreement(wb, before.samples)
nb.record("rollout/logprob_max_abs_diff_fresh", fresh["max_abs_diff"])

# %%
history = wb.train(STEPS)
nb.show(viz.curves(history, ["train/loss", "mtp/loss"], title="training loss"), name="train", interactive=INTERACTIVE)

# %%
stale = ex.logprob_agreement(wb, before.samples)
nb.record("rollout/logprob_max_abs_diff_stale", stale["max_abs_diff"])

# %%
m = wb.sync(SyncConfig(transport=TRANSPORT, bucket_mb=BUCKET_MB, probe=PROBE))
nb.record({k: m.get(k) for k in ("sync/verified", "sync/weight_version", "timing/sync/total", "sync/probe_kl",
                                  "sync/probe_max_abs_logprob_diff")})  # the probe's keys: None with PROBE = 0

# %%
after = wb.rollout(N_PROMPTS, temperature=TEMPERATURE, seed=SEED, max_new_tokens=MAX_NEW_TOKENS)
nb.record({"rollout/reward_after": after.metrics["rollout/reward_mean"],
           "rollout/weight_version_after": after.metrics["rollout/weight_version"]})
pd.DataFrame(ex.side_by_side(before, after)).head(8)

# %%
synced = ex.logprob_agreement(wb, after.samples)
nb.record("rollout/logprob_max_abs_diff_synced", synced["max_abs_diff"])
nb.show(viz.logprob_agreement({"fresh": fresh, "stale (trained, engine not synced)": stale, "synced": synced}),
        name="logprob_agreement", interactive=INTERACTIVE)

# %%
from labkit.cluster import runtime

wb.close()
runtime.shutdown()
