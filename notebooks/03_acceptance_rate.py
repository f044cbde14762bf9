# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · MTP draft acceptance
#
# How often would the MTP draft head's guesses be accepted by the policy in speculative decoding, and how
# does that change as the policy trains? Two arms over training steps: **joint** (the draft is trained along
# with the policy) and **frozen_draft** (only the policy trains; the draft drifts out of date).
#
# Source: `labkit.mtp.experiment` (real speculative decoding in the engine) when it is installed; until then
# an **offline estimate** (`labkit.accept_offline`): greedy chained acceptance from one teacher-forced
# trainer forward on held-out task text. `accept/source` in the metrics says which one ran.

# %%
from labkit import nb

nb.env_report();

# %% tags=["parameters"]
SOURCE = "auto"  # auto (mtp experiment if available, else offline) | mtp | offline
ARMS = "joint,frozen_draft"  # comma list: joint, frozen_draft
STEPS = 6  # training steps per arm
EVAL_N = 64  # held-out problems for the offline estimate
LR = 0.003
QUICK = False  # passed to labkit.mtp.experiment.run
INTERACTIVE = False

# %% tags=["validate"]
nb.check_params(globals(), {
    "SOURCE": nb.Choice("auto", "mtp", "offline"), "ARMS": nb.Subset("joint", "frozen_draft"),
    "STEPS": nb.Int(0, 200), "EVAL_N": nb.Int(1, 4096), "LR": nb.Float(1e-6, 0.1), "QUICK": nb.Bool(),
    "INTERACTIVE": nb.Bool()});

# %%
from labkit import accept_offline, viz

use_mtp = accept_offline.mtp_available() if SOURCE == "auto" else SOURCE == "mtp"
print("source:", "labkit.mtp.experiment" if use_mtp else "offline estimate (labkit.accept_offline)")

# %%
if use_mtp:
    from labkit.mtp import experiment

    result = experiment.run(quick=QUICK)
else:
    result = accept_offline.run(arms=tuple(a.strip() for a in ARMS.split(",")), steps=STEPS, eval_n=EVAL_N, lr=LR)
nb.record(result["metrics"])

# %%
nb.show(viz.acceptance(result["history"]), name="acceptance", interactive=INTERACTIVE)

# %%
import pandas as pd

pd.DataFrame(result["history"])

# %%
from labkit.cluster import runtime

runtime.shutdown()
