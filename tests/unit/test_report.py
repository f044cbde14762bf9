"""README tables are generated from data/ and kept current (a number in the README is one a stored run holds)."""

import json

from labkit.workbench import report


def test_readme_tables_match_the_stored_runs():
    assert report.update(check=True) == []


def test_a_stale_table_is_found_and_rebuilt(tmp_path):
    run = {"command": "labkit faults --json", "faults/trials": 2, "faults/recovered": 2, "faults/half_updated": 0,
           "faults/modified_then_restored": 1, "faults/engine_restarts": 0, "faults/recover_s_max": 1.5,
           "faults/served_mid_sync": 0, "faults/mid_sync_probes": 2, "faults/wall_s": 60.0,
           "faults/per_kind": {"exception": {"trials": 2, "recovered": 2, "half_updated": 0,
                                             "modified_then_restored": 1, "engine_restarted": 0,
                                             "recover_s_max": 1.5}}}
    (tmp_path / "faults_cpu.json").write_text(json.dumps(run))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- table:faults -->\n| old |\n<!-- /table:faults -->\nend\n")
    assert report.update(readme, tmp_path, check=True) == ["faults"]
    assert "| old |" in readme.read_text()  # --check changes nothing
    assert report.update(readme, tmp_path) == ["faults"]
    text = readme.read_text()
    assert "| exception | 2 | 2 | 0 | 1 | 0 | 1.5 |" in text and "`labkit faults --json`" in text
    assert report.update(readme, tmp_path, check=True) == []


def test_objective_runs_pair_with_the_default_runs_frozen_arm(tmp_path):
    """Each objective's trained arm is paired seed by seed with the default run's frozen arm; every file and
    command is named."""
    base = {"command": "labkit mtp-experiment", "metrics": {"mtp/per_seed": [
        {"mtp/seed": s, "mtp/final_accept_rate_frozen": f} for s, f in ((0, 0.70), (1, 0.72), (2, 0.71))]}}
    (tmp_path / "mtp_experiment_cpu.json").write_text(json.dumps(base))
    for target, rates in (("tv", (0.80, 0.82, 0.81)), ("policy", (0.75, 0.77, 0.76))):
        per = [{"mtp/seed": s, "mtp/final_accept_rate_trained": r} for s, r in zip((0, 1, 2), rates)]
        run = {"command": f"labkit mtp-experiment --arms trained --mtp-target {target}", "metrics": {
            "mtp/per_seed": per, "mtp/target": target, "mtp/draft_sync_every": 1,
            "mtp/final_accept_rate_trained_mean": sum(rates) / 3, "mtp/final_accept_rate_trained_ci95": [0.7, 0.9],
            "mtp/tail_accept_rate_trained_mean": 0.8, "mtp/tail_accept_rate_trained_ci95": None}}
        (tmp_path / f"mtp_objective_{target}.json").write_text(json.dumps(run))
    text = report.render("mtp-objectives", tmp_path)
    assert "| tv | every 1 step(s) | 0.810 [0.700, 0.900] | 0.800 (one seed: no interval) | 0.100 [0.100, 0.100]" in text
    assert "| policy |" in text and "0.050 [0.050, 0.050]" in text
    assert "`labkit mtp-experiment --arms trained --mtp-target tv`" in text and "mtp_objective_policy.json" in text
