# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Soak: hundreds of syncs into engines that serve, with faults
#
# An RL run is hundreds to thousands of syncs into an engine that also serves. `labkit soak` runs one trainer and
# two engines synced together (an SGLang HTTP server under labkit's and an OpenAI client's requests, and a Ray actor
# engine), a seeded schedule of transports and bucket sizes, and a fault every few syncs. Every sync is checked
# (verified, or restored with no engine half-updated), every response against its weight version's greedy output,
# and every process's memory, descriptors and threads, /dev/shm and Ray's object store are sampled sync after sync.
# The served draft's acceptance is measured on held-out prompts, twice each time.
#
# By default this draws the stored 20-minute run (`data/soak_cpu.json`). `MINUTES > 0` runs a fresh soak first
# (it starts Ray, a trainer and two engines: a minute on 2 cores, then MINUTES of syncs).
#
# Headless: `labkit notebook run 06_soak -p MINUTES 2`.

# %%
from labkit.workbench import nb

nb.env_report();

# %% tags=["parameters"]
RUN = "data/soak_cpu.json"  # a stored soak to draw (used when MINUTES is 0)
MINUTES = 0.0  # > 0: run a fresh soak of this many minutes instead
SEED = 0  # the fresh soak's schedule
WARMUP = 50  # syncs before the leak and drift slopes count (a short soak: 10)
INTERACTIVE = False  # True in JupyterLab: zoomable figure widgets

# %% tags=["validate"]
nb.check_params(globals(), {"RUN": nb.Str(), "MINUTES": nb.Float(0, 24 * 60), "SEED": nb.Int(0, 2**31),
                            "WARMUP": nb.Int(2, 100000), "INTERACTIVE": nb.Bool()});

# %%
from labkit.lab.soak import run as soak

m = soak.load_or_run(RUN, minutes=MINUTES, seed=SEED, warmup=WARMUP)
nb.record({k: v for k, v in m.items() if k.startswith("soak/") and k != "soak/series"})

# %% [markdown]
# Each target of the soak beside what this run measured (the table `labkit report` writes into docs/soak.md).

# %%
from labkit.lab.report.soak import soak_table
from IPython.display import Markdown

Markdown("\n".join(soak_table(m)))

# %% [markdown]
# Resident memory of every process under the driver, sync after sync (a restarted engine or trainer is a new line).
# After warm-up each slope is judged against 1 MB per 100 syncs.

# %%
from labkit.workbench import viz_soak

nb.show(viz_soak.memory(m), name="soak_memory", interactive=INTERACTIVE)

# %% [markdown]
# Sync end-to-end time and the served engine's pause, clean syncs as lines, faulted syncs as red markers.

# %%
nb.show(viz_soak.sync_times(m), name="soak_sync_times", interactive=INTERACTIVE)
