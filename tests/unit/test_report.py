"""The generated tables of README.md and docs/ come from data/ and are kept current (a number in a table is one a
stored run holds): each is rebuilt in the page that holds its marker, and `--check` fails on a stale table or on a
table whose data file is missing."""

import json

import pytest

from labkit.lab.report import generate as report
from labkit.lab.report.markdown import md_cell, md_head, md_row
from labkit.lab.report.mtp import mtp_table
from labkit.mtp import stats

PROV = {"commit": "c" * 40, "dirty": False, "date_utc": "2026-11-27T10:00:00+00:00",
        "host": {"cores": 2, "cpu_model": "Xeon", "memory_gib": 23.5, "gpus": []}}
FAULTS_RUN = {"command": "labkit faults --json", "provenance": PROV, "faults/trials": 2, "faults/fired": 2,
              "faults/recovered": 2, "faults/half_updated": 0,
              "faults/modified_then_restored": 1, "faults/engine_restarts": 0, "faults/recover_s_max": 1.5,
              "faults/served_mid_sync": 0, "faults/mid_sync_probes": 2, "faults/wall_s": 60.0,
              "faults/per_kind": {"exception": {"trials": 2, "fired": 2, "recovered": 2, "half_updated": 0,
                                                "modified_then_restored": 1, "engine_restarted": 0,
                                                "recover_s_max": 1.5}}}
FAULTS_ROW = "| exception | 2 | 2 | 2 | 0 | 1 | 0 | 1.5 |"


def test_the_tables_of_every_page_match_the_stored_runs():
    """README.md and every docs/**/*.md page, each table in some page, each built from a stored run."""
    assert report.update(check=True) == []
    found = {p.relative_to(report.ROOT).as_posix(): [m.group(2) for m in report.MARKER.finditer(p.read_text())]
             for p in report.pages()}
    placed = [name for names in found.values() for name in names]
    assert sorted(set(placed)) == sorted(report.TABLES)
    assert "docs/faults.md" in found and "faults" in found["docs/faults.md"]  # the docs pages are read


@pytest.fixture
def house(tmp_path, monkeypatch):
    """A repository of its own: README.md, docs/, data/ under tmp_path, and the module's ROOT and DATA on it, so
    nothing here reads or writes the real pages or runs."""
    (tmp_path / "docs" / "deep").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "README.md").write_text("# readme\nno tables here\n")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(report, "DATA", tmp_path / "data")
    return tmp_path


def _only(monkeypatch, *names):
    """Only these tables exist (the others would be reported as placed in no page)."""
    monkeypatch.setattr(report, "TABLES", {n: report.TABLES[n] for n in names})


def test_a_stale_table_is_found_and_rebuilt(house, monkeypatch):
    _only(monkeypatch, "faults")
    (house / "data" / "faults_cpu.json").write_text(json.dumps(FAULTS_RUN))
    readme = house / "README.md"
    readme.write_text("intro\n<!-- table:faults -->\n| old |\n<!-- /table:faults -->\nend\n")
    assert report.update(check=True) == ["faults"]
    assert "| old |" in readme.read_text()  # --check changes nothing
    assert report.update(check=False) == ["faults"]
    text = readme.read_text()
    assert FAULTS_ROW in text and "`labkit faults --json`" in text and text.endswith("<!-- /table:faults -->\nend\n")
    assert report.update(check=True) == []


def test_a_table_in_a_docs_page_is_regenerated_there(house, monkeypatch):
    """The marker sits in docs/deep/faults.md, not in README.md: the table is written there, README is left as it
    was, and --check reads the docs page."""
    _only(monkeypatch, "faults")
    (house / "data" / "faults_cpu.json").write_text(json.dumps(FAULTS_RUN))
    page = house / "docs" / "deep" / "faults.md"
    page.write_text("# Faults\n\n<!-- table:faults -->\n| old |\n<!-- /table:faults -->\n\nprose after\n")
    readme_before = (house / "README.md").read_text()
    assert report.update(check=True) == ["faults"]
    assert report.update(check=False) == ["faults"]
    assert FAULTS_ROW in page.read_text() and "| old |" not in page.read_text()
    assert page.read_text().startswith("# Faults\n\n<!-- table:faults -->\n") and "prose after" in page.read_text()
    assert (house / "README.md").read_text() == readme_before
    assert report.update(check=True) == []
    page.write_text(page.read_text().replace("| 1.5 |", "| 9.9 |"))  # hand-edited number in the docs page
    assert report.update(check=True) == ["faults"]


def test_check_fails_when_a_data_file_a_table_needs_is_missing(house, monkeypatch):
    """No data/bench_delta_cpu.json: the bench-delta table is a problem (not silently skipped), its old text stays;
    the faults table beside it is still rebuilt."""
    _only(monkeypatch, "faults", "bench-delta")
    (house / "data" / "faults_cpu.json").write_text(json.dumps(FAULTS_RUN))
    page = house / "docs" / "delta.md"
    body = "<!-- table:bench-delta -->\n| kept |\n<!-- /table:bench-delta -->\n"
    page.write_text(body + "<!-- table:faults -->\n<!-- /table:faults -->\n")
    problems = report.update(check=True)
    assert "faults" in problems
    assert any(p.startswith("bench-delta:") and "data/bench_delta_cpu.json missing" in p and "docs/delta.md" in p
               for p in problems)
    problems = report.update(check=False)
    assert any(p.startswith("bench-delta:") for p in problems)
    assert page.read_text().startswith(body) and FAULTS_ROW in page.read_text()
    assert report.update(check=True) == [next(p for p in problems if p.startswith("bench-delta:"))]


def test_check_fails_on_a_quoted_run_without_the_provenance_of_a_clean_commit(house, monkeypatch):
    """A table's run and a run named in prose alike: dirty, without provenance, or missing is a problem."""
    _only(monkeypatch, "faults")
    page = house / "docs" / "faults.md"
    page.write_text("<!-- table:faults -->\n<!-- /table:faults -->\n")
    (house / "data" / "faults_cpu.json").write_text(json.dumps(FAULTS_RUN))
    assert report.update(check=False) == ["faults"] and report.update(check=True) == []
    assert "`data/faults_cpu.json`: commit `cccccccccc` (clean), 2026-11-27, 2 cores Xeon, 23.5 GiB" in page.read_text()
    (house / "data" / "faults_cpu.json").write_text(json.dumps({**FAULTS_RUN, "provenance": {**PROV, "dirty": True}}))
    assert report.update(check=True) == ["faults", "data/faults_cpu.json (named in docs/faults.md): made from a "
                                         "dirty tree"]
    (house / "data" / "faults_cpu.json").write_text(json.dumps({**FAULTS_RUN, "provenance": None}))  # stored before
    report.update(check=False)
    assert "`data/faults_cpu.json`: no provenance recorded" in page.read_text()
    assert report.update(check=True) == ["data/faults_cpu.json (named in docs/faults.md): no provenance"]
    (house / "README.md").write_text("prose quoting `data/other_cpu.json` and data/gone.json, not runs/data/x.json\n")
    (house / "data" / "other_cpu.json").write_text(json.dumps({"provenance": {**PROV, "commit": None}}))
    assert report.update(check=True)[:2] == ["data/other_cpu.json (named in README.md): no commit",
                                             "data/gone.json (named in README.md): missing"]


def test_check_fails_on_a_pair_with_a_missing_half_and_on_a_paired_sweep_without_its_baseline(house, monkeypatch):
    _only(monkeypatch, "bench-sync-repeats", "mtp-objectives")
    data = house / "data"
    (data / "bench_sync_cpu.json").write_text("{}")  # its MoE half is missing
    (data / "mtp_sweep_x.json").write_text("{}")  # no mtp_experiment_cpu.json to pair with
    (house / "docs" / "x.md").write_text("<!-- table:bench-sync-repeats -->\n<!-- /table:bench-sync-repeats -->\n"
                                         "<!-- table:mtp-objectives -->\n<!-- /table:mtp-objectives -->\n")
    problems = report.update(check=True)
    assert len(problems) == 2
    assert problems[0].startswith("bench-sync-repeats:") and "bench_sync_moe_cpu.json missing" in problems[0]
    assert problems[1].startswith("mtp-objectives:") and "data/mtp_experiment_cpu.json missing" in problems[1]


def test_a_marker_without_a_table_and_a_table_in_no_page_are_problems(house, monkeypatch):
    _only(monkeypatch, "faults")
    (house / "data" / "faults_cpu.json").write_text(json.dumps(FAULTS_RUN))
    (house / "docs" / "x.md").write_text("<!-- table:nope -->\n<!-- /table:nope -->\n")
    assert report.update(check=True) == ["nope: no such table (marker in docs/x.md)",
                                         "faults: in no page (no `<!-- table:faults -->` in README.md or docs/)"]


def test_the_mtp_table_names_the_recorded_host_or_none():
    m = {"mtp/arms": [], "mtp/per_seed": [], "mtp/eval_disjoint": True, "mtp/rollouts_identical_step0": True,
         "mtp/rollouts_identical_fraction": 1.0, "mtp/start_accept_rate": 0.8, "mtp/start_reward": 0.7,
         "mtp/seeds": [0], "mtp/steps": 2, "mtp/k": 1, "timing/mtp_experiment/total": 120.0}
    last = mtp_table({"metrics": m})[-1]
    assert last.endswith("k = 1, 2.0 min") and "box" not in last
    host = {"name": "ci", "cpu_model": "AMD EPYC 7B13", "cores": 2, "memory_gib": 24.0, "gpus": []}
    assert mtp_table({"metrics": m, "provenance": {"host": host}})[-1].endswith("2.0 min on 2 cores, AMD EPYC 7B13")


def test_markdown_helpers():
    assert md_row(["a", 1]) == "| a | 1 |"
    assert md_head(["a", "b"]) == ["| a | b |", "| --- | --- |"]
    assert md_cell("x | y") == "x \\| y"


def _per_seed(arm: str, finals, tails) -> list[dict]:
    return [{"mtp/seed": s, f"mtp/final_accept_rate_{arm}": f, f"mtp/tail_accept_rate_{arm}": t}
            for s, f, t in zip((0, 1, 2), finals, tails)]


def _record(arms: dict, **extra) -> dict:
    """A notebook-03 record: per-seed rows for `arms` ({arm: (finals, tails)}) and the keys the table reads."""
    per = [{"mtp/seed": s} for s in (0, 1, 2)]
    rec = {"status": "ok", "mtp/draft_sync_every": 1, **extra}
    for arm, (finals, tails) in arms.items():
        for s, one in zip(per, _per_seed(arm, finals, tails)):
            s.update(one)
        rec.update({f"mtp/final_accept_rate_{arm}_mean": sum(finals) / 3,
                    f"mtp/final_accept_rate_{arm}_ci95": [0.7, 0.9],
                    f"mtp/tail_accept_rate_{arm}_mean": sum(tails) / 3, f"mtp/tail_accept_rate_{arm}_ci95": None})
    for s in per:  # a k = 2 run's per-depth keys name no arm
        s["mtp/final_accept_rate_pos_1_trained"] = 0.9
    return {**rec, "mtp/per_seed": per}


def test_draft_schedules_pair_with_the_default_runs_frozen_arm(tmp_path):
    """Each objective and cadence of the stored sweeps is paired seed by seed with the default run's frozen arm
    (final and last quarter); a plain frozen arm compares nothing and a failed sweep value is left out; every
    file and command is named."""
    base = {"command": "labkit mtp-experiment", "metrics": {"mtp/per_seed": _per_seed(
        "frozen", (0.70, 0.72, 0.71), (0.60, 0.60, 0.60))}}
    (tmp_path / "mtp_experiment_cpu.json").write_text(json.dumps(base))
    objective = {"command": "labkit notebook sweep 03 --over MTP_TARGET", "key": "MTP_TARGET", "rows": [
        {"MTP_TARGET": "tv", **_record({"trained": ((0.80, 0.82, 0.81), (0.7, 0.7, 0.7))}, **{"mtp/target": "tv"})},
        {"MTP_TARGET": "policy", "status": "error", "error": "ValueError: x"}]}
    pre = {"command": "labkit notebook sweep 03 --over PRE_RL_STEPS", "key": "PRE_RL_STEPS", "rows": [
        {"PRE_RL_STEPS": 20, **_record({"frozen": ((0.75, 0.77, 0.76), (0.65, 0.65, 0.65)),
                                        "trained": ((0.80, 0.82, 0.81), (0.7, 0.7, 0.7))},
                                       **{"mtp/target": "tokens", "mtp/pre_rl_steps": 20})}]}
    (tmp_path / "mtp_sweep_objective.json").write_text(json.dumps(objective))
    (tmp_path / "mtp_sweep_pre_rl.json").write_text(json.dumps(pre))
    text = report.render("mtp-objectives", tmp_path)
    assert ("| tv | every step | 0.810 [0.700, 0.900] | 0.700 (one seed: no interval) | 0.100 [0.100, 0.100] | "
            "0.100 [0.100, 0.100] | not recorded | 0, 1, 2 |") in text
    assert "| tokens | pre-RL only (20 MTP-only steps) | 0.760 [0.700, 0.900] |" in text
    assert "| tokens | every step, after 20 pre-RL steps |" in text and "0.050 [0.050, 0.050]" in text
    assert "policy" not in text.split("(from")[0] and text.count("\n| ") == 4  # header, rule, three rows
    assert "`labkit notebook sweep 03 --over MTP_TARGET`" in text and "mtp_sweep_pre_rl.json" in text
    from labkit.workbench import viz
    from labkit.lab.report.mtp import draft_rows

    fig = viz.draft_schedules(draft_rows(*report._runs(tmp_path, "mtp_sweep_*.json")))
    assert list(fig.data[0].y) == ["tv · every step", "tokens · pre-RL only (20 MTP-only steps)",
                                   "tokens · every step, after 20 pre-RL steps"]
    assert list(fig.data[1].x) == pytest.approx([0.1, 0.05, 0.1])  # the paired differences, drawn beside


def test_the_repeats_table_has_a_column_per_stored_run_and_the_range(tmp_path):
    """Every stored run of the bench pair side by side (run 1 in the headline files), each file named."""
    def dense(mem, colo):
        return {"command": "labkit bench sync --json --out x", "bench/memcpy_gbps": mem, "bench/colocated_gbps": colo,
                "bench/colocated_vs_memcpy": colo / mem, "bench/colocated_vs_memcpy_end_to_end": 0.1,
                "bench/direct_vs_memcpy": 0.4, "bench/direct_vs_memcpy_end_to_end": 0.12,
                "bench/distributed_vs_memcpy": 0.07, "bench/speedup_end_to_end": 27.0, "bench/verified": True}

    moe = {"command": "labkit bench sync --model qwen3-moe --json --out y", "bench/colocated_gbps": 3.0,
           "bench/verified": True}
    runs = {"bench_sync_cpu.json": dense(20.0, 6.0), "bench_sync_cpu_2.json": dense(15.0, 5.0),
            "bench_sync_moe_cpu.json": moe, "bench_sync_moe_cpu_2.json": {**moe, "bench/verified": False}}
    for name, run in runs.items():
        (tmp_path / name).write_text(json.dumps(run))
    text = report.render("bench-sync-repeats", tmp_path)
    assert "| metric | run 1 | run 2 | range |" in text
    assert "| memcpy reference (GB/s) | 20.0 | 15.0 | 15.0–20.0 |" in text
    assert "| colocated, transport-only, of a memcpy | 0.300 | 0.333 | 0.300–0.333 |" in text
    assert "| MoE preset's colocated GB/s, of the bench model's | 0.50 | 0.60 | 0.50–0.60 |" in text
    assert "| `bench/verified` (both models) | True | False |  |" in text
    assert "`data/bench_sync_moe_cpu_2.json`" in text and "`labkit bench sync --model qwen3-moe --json`" in text


def test_the_family_table_has_a_row_per_stored_sync_named_by_its_preset(tmp_path):
    def run(model, verified, wrong=()):
        return {"command": f"labkit sync --model {model} --transport colocated --json --out x",
                "sync/num_tensors": 4179, "sync/bytes": 299_706_112, "sync/num_buckets": 9,
                "verify/num_checked": 147, "verify/mismatched": list(wrong), "sync/apply_path": "copy_plan",
                "sync/verified": verified, "rollout/greedy_match_frac": 1.0, "timing/sync/total": 1.234}

    (tmp_path / "sync_qwen3_moe_cpu.json").write_text(json.dumps(run("qwen3-moe", True)))
    (tmp_path / "sync_mimo_cpu.json").write_text(json.dumps(run("mimo", False, ["lm_head.weight"])))
    (tmp_path / "mtp_experiment_cpu.json").write_text("{}")
    text = report.render("family-syncs", tmp_path)
    rows = [r for r in text.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert rows == ["| mimo | 4,179 | 299.7 | 9 | 147 (1 wrong) | copy_plan | False | 100% | 1.23 |",
                    "| qwen3-moe | 4,179 | 299.7 | 9 | 147 | copy_plan | True | 100% | 1.23 |"]
    assert "`data/sync_qwen3_moe_cpu.json` by `labkit sync --model qwen3-moe" in text


def test_the_serve_table_has_a_row_per_pause_mode_of_each_backend_the_servers_first(tmp_path):
    def run(backend, modes, refused=()):
        out = {"command": f"labkit bench serve-sync --backend {backend} --json", "serve/backend": backend,
               "serve/modes": list(modes), "serve/idle_sync_seconds": 0.05, "serve/ok": backend == "http"}
        for m in modes:
            if m in refused:
                out[f"serve/refused/{m}"] = "flush refused"
                continue
            out.update({f"serve/requests/{m}": 10, f"serve/in_flight_during_sync/{m}": 9,
                        f"serve/mixed_responses/{m}": 0, f"serve/aborted/{m}": 3, f"serve/retracted/{m}": 0,
                        f"serve/pause_seconds/{m}": 0.125, f"serve/sync_seconds/{m}": 0.5})
        return out

    (tmp_path / "bench_serve_sync_actor_cpu.json").write_text(json.dumps(run("actor", ["abort"])))
    (tmp_path / "bench_serve_sync_cpu.json").write_text(json.dumps(run("http", ["abort", "in_place"], ["in_place"])))
    (tmp_path / "mtp_experiment_cpu.json").write_text("{}")
    text = report.render("serve-sync", tmp_path)
    rows = [r for r in text.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert rows == ["| http | abort | 10 | 9 | 0 | 3 | 0 | 0.12 | 0.50 |",
                    "| http | in_place | refused by the atomic guard |  |  |  |  |  |  |",
                    "| actor | none: held by the handle | 10 | 9 | 0 | 3 | 0 | 0.12 | 0.50 |"]
    assert "Idle sync (no traffic): http 0.05 s, actor 0.05 s; `serve/ok`: False." in text


def test_the_replication_table_applies_the_preregistered_analysis():
    from labkit.lab.report.replication import replication_table

    def run(frozen: dict, trained: dict, nested: bool = False) -> dict:
        per_seed = [{"mtp/seed": s, "mtp/final_accept_rate_frozen": frozen[s],
                     "mtp/final_accept_rate_trained": trained[s]} for s in frozen]
        m = {"mtp/per_seed": per_seed, "mtp/diff_trained_frozen_mean": 0.125}
        return {"metrics": m} if nested else m

    base = run({0: 0.70, 1: 0.72, 2: 0.74}, {0: 0.82, 1: 0.85, 2: 0.86}, nested=True)
    default = run({10: 0.71, 11: 0.73, 12: 0.70}, {10: 0.83, 11: 0.86, 12: 0.81})
    slow = run({10: 0.71, 11: 0.73, 12: 0.70}, {10: 0.75, 11: 0.74, 12: 0.72})
    lines = replication_table({"runs": [("mtp_replication_lr1x.json", slow), ("mtp_replication_default.json",
                                                                              default)], "baseline": base})
    rows = [line for line in lines if line.startswith("| replication")]
    assert rows[0].startswith("| replication, defaults |") and "| 10,11,12 |" in rows[0]
    assert "| yes | yes |" in rows[0]  # above 0; the original 0.125 inside the interval
    assert rows[1].startswith("| replication, draft lr x1 |")
    mean, ci = stats.paired([0.83, 0.86, 0.81], [0.71, 0.73, 0.70])
    assert f"{mean:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" in rows[0]
    assert lines[-1].startswith("The draft lr ×5 over ×1") and "seed by seed: True" in lines[-1]
