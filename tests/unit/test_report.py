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
