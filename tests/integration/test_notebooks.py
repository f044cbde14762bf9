"""Every notebook executes headless (papermill, a fresh kernel each) with quick parameters; the tests read the
metrics the notebook recorded through labkit.workbench.nb.record, never cell text. Notebook 01 runs in a real
browser instead (tests/integration/test_browser.py checks the same metrics); its bad parameters are checked here.
Bad parameters fail at the validation cell, before anything heavy starts, with a message that names the parameter.

Each notebook starts its own Ray + Megatron trainer + SGLang engine (~60-90 s on 2 cores), so the quick
parameters keep everything after start-up to a few seconds.
"""

import json

import nbformat
import pytest

from labkit.workbench import notebook

pytestmark = pytest.mark.integration

QUICK = {
    "01_weight_update": {"STEPS": 1, "BUCKET_MB": 0.25},
    "02_rollout": {"N_PROMPTS": 8, "STEPS": 2},
    "03_acceptance_rate": {"QUICK": True, "ARMS": "trained", "SPEC": "loop"},  # engine mode: test_mtp_experiment
    "04_bucket_tuning": {"MODEL": "tiny", "MIN_MB": 0.0625, "MAX_MB": 0.5, "MEMORY_BUDGET_MB": 1.0, "REPEATS": 1,
                         "MAX_TRIALS": 2, "STEPS": 0},
    "05_sync_roofline": {"MODEL": "moonlight-16b-a3b", "HARDWARE": "H20"},
    "06_soak": {},  # the stored run (a fresh soak is tests/integration/test_soak.py)
}


@pytest.fixture(scope="module")
def out_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def _run(name, out_root, **extra):
    return notebook.run(name, {**QUICK[name], **extra}, out_root=out_root)


def _outputs(m: dict, name: str):
    from pathlib import Path

    d = Path(m["notebook/out_dir"])
    return d, nbformat.read(d / f"{name}.ipynb", as_version=4)


def _has_plotly(nb) -> bool:
    return any("application/vnd.plotly.v1+json" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.outputs)


def test_02_rollout_logprobs_agree_after_sync(out_root):
    m = _run("02_rollout", out_root)
    assert m["sync/verified"] is True
    assert m["rollout/weight_version_before"] != m["rollout/weight_version_after"] == m["sync/weight_version"]
    assert 0.0 <= m["rollout/reward_before"] <= 1.0 and 0.0 <= m["rollout/reward_after"] <= 1.0
    # Same weights on both sides (fp32): log-probs agree to rounding; a stale engine does not.
    assert m["rollout/logprob_max_abs_diff_fresh"] < 1e-3
    # Also catches an engine that serves KV computed with the old weights: SGLang's radix cache keeps prefix KV
    # across a weight update unless the cache is flushed, and the char-level prompts share prefixes.
    assert m["rollout/logprob_max_abs_diff_synced"] < 1e-3, "engine serves stale prefix KV after the sync"
    assert m["rollout/logprob_max_abs_diff_stale"] > 10 * m["rollout/logprob_max_abs_diff_synced"]
    # the sync's behaviour probe (PROBE = 8 by default): an fp32 engine computes what the fp32 trainer does
    assert 0.0 <= m["sync/probe_kl"] < 1e-4 and m["sync/probe_max_abs_logprob_diff"] < 1e-3
    d, nb = _outputs(m, "02_rollout")
    assert _has_plotly(nb) and (d / "logprob_agreement.html").exists()


def test_03_acceptance_under_rl(out_root):
    m = _run("03_acceptance_rate", out_root)
    assert m["mtp/steps"] == 2 and m["mtp/k"] == 1
    # The standalone speculative run: k=2 chained drafts, SGLang-style counters, per-position rates.
    assert m["spec/k"] == 2 and 1.0 <= m["spec/accept_length"] <= 3.0
    assert all(0.0 <= m[f"spec/accept_rate_pos_{i}"] <= 1.0 for i in (1, 2))
    assert 0.0 <= m["mtp/final_accept_rate_trained"] <= 1.0 and 1.0 <= m["mtp/final_accept_length_trained"] <= 3.0
    assert 0.0 <= m["mtp/final_reward_trained"] <= 1.0 and m["mtp/offline_vs_measured_rel_err"] >= 0.0
    assert m["mtp/spec"] == "loop"  # the notebook's SPEC reaches the experiment (the engine mode's own test is longer)
    d, nb = _outputs(m, "03_acceptance_rate")
    assert _has_plotly(nb) and (d / "acceptance.html").exists() and (d / "per_position.html").exists()


def test_04_bucket_sweep_and_autotune(out_root):
    m = _run("04_bucket_tuning", out_root)
    sizes = [r["bucket_bytes"] for r in m["tune/curve"]]
    assert len(sizes) == m["tune/sizes"] >= 3 and max(sizes) * 2 <= 1 << 20  # budget admits <= half of it
    assert m["tune/best_bucket_bytes"] in sizes and 1 <= m["tune/trials"] <= 2
    assert m["tune/metric"] == "timing/sync/transport_only"  # the quantity `labkit tune` minimises too
    assert m["sync/verified"] is True and m["sync/bucket_bytes"] == m["tune/best_bucket_bytes"]
    d, nb = _outputs(m, "04_bucket_tuning")
    assert _has_plotly(nb) and (d / "bucket_sweep.html").exists() and (d / "sync_phases_by_bucket.html").exists()


def test_05_roofline_writes_its_tables_and_figure(out_root):
    """No Ray, trainer or engine: counts and spec sheets only. The tables are data (JSON) and the figure is stored."""
    m = _run("05_sync_roofline", out_root)
    assert m["roofline/model"] == "Moonlight-16B-A3B" and 15e9 < m["roofline/params"] < 17e9
    bounds = [m[f"roofline/bound_s/{t}"] for t in ("colocated", "nvlink-broadcast", "rdma-broadcast")]
    assert 0 < bounds[0] < bounds[1] < bounds[2], bounds  # HBM copy < NVLink < one NIC
    assert all(m[f"roofline/predicted_s/{t}"] >= m[f"roofline/bound_s/{t}"] for t in ("colocated", "rdma-p2p"))
    rows = m["roofline/published"]
    assert len(rows) >= 5 and all(r["source"] and 0 < r["fraction_of_limit"] <= 1 for r in rows), rows
    d, nb = _outputs(m, "05_sync_roofline")
    assert _has_plotly(nb) and (d / "bucket_whatif.html").exists()
    assert json.loads((d / "published_systems.json").read_text()) and (d / "transport_bounds.json").exists()


def test_06_soak_draws_the_stored_run(out_root):
    """No Ray, trainer or engine: the stored soak's numbers recorded, its table and both figures drawn."""
    m = _run("06_soak", out_root)
    assert m["soak/syncs"] > 0 and m["soak/minutes"] == 20 and "soak/ok" in m
    d, nb = _outputs(m, "06_soak")
    assert _has_plotly(nb) and (d / "soak_memory.html").exists() and (d / "soak_sync_times.html").exists()


@pytest.mark.parametrize("name,params,needle", [
    ("01_weight_update", {"STPES": 2}, "unknown parameter 'STPES' (did you mean 'STEPS'?)"),
    ("01_weight_update", {"BUCKET_MB": "big"}, "BUCKET_MB='big' is invalid: expected a number"),
    ("01_weight_update", {"STEPS": 2.5}, "STEPS=2.5 is invalid: expected an integer in [0, 200]"),
    ("04_bucket_tuning", {"MEMORY_BUDGET_MB": -1}, "MEMORY_BUDGET_MB=-1 is invalid"),
    ("04_bucket_tuning", {"MODEL": "huge"}, "MODEL='huge' is invalid: expected one of 'tiny', 'quick', 'bench'"),
    ("02_rollout", {"TRANSPORT": "carrier-pigeon"}, "TRANSPORT='carrier-pigeon' is invalid: expected one of"),
    ("05_sync_roofline", {"HARDWARE": "A100"}, "HARDWARE='A100' is invalid: expected one of"),
    ("06_soak", {"MINUTES": -1}, "MINUTES=-1 is invalid"),
])
def test_bad_parameter_fails_at_the_validation_cell(name, params, needle, out_root):
    with pytest.raises(notebook.NotebookError) as e:
        notebook.run(name, params, out_root=out_root)
    assert e.value.ename == "ValueError" and e.value.cell_tags == ("validate",), str(e.value)
    assert needle in e.value.evalue and needle in str(e.value)
    assert "the validate cell" in str(e.value)
