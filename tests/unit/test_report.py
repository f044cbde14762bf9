"""README tables are generated from data/ and kept current (a number in the README is one a stored run holds)."""

import json

import pytest

from labkit.lab.report import generate as report


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
            "0.100 [0.100, 0.100] | 0, 1, 2 |") in text
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
