"""The notebook workbench without a kernel: pairing/stripping, notebook structure, parameter validation,
metric recording, figures, and the run/sweep CLI plumbing (papermill replaced by a fake)."""

import ast
import csv
import json
import shutil

import nbformat
import pytest

from labkit.cli import main as labkit_main
from labkit.workbench import nb, notebook, viz, viz_positions

NAMES = notebook.names()


def test_notebooks_are_paired_and_stripped():
    assert NAMES == ["01_weight_update", "02_rollout", "03_acceptance_rate", "04_bucket_tuning", "05_sync_roofline",
                     "06_soak"]
    assert notebook.check_pairs() == []


def test_check_pairs_catches_outputs_and_drift(tmp_path):
    for ext in ("ipynb", "py"):
        shutil.copy(notebook.NOTEBOOKS / f"01_weight_update.{ext}", tmp_path)
    book = nbformat.read(tmp_path / "01_weight_update.ipynb", as_version=4)
    code = next(c for c in book.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="hi")]
    book.cells[0].source += "\nedited only in the ipynb"
    nbformat.write(book, tmp_path / "01_weight_update.ipynb")
    (tmp_path / "orphan.py").write_text("# %%\n1\n")
    problems = "\n".join(notebook.check_pairs(tmp_path))
    assert "has outputs" in problems and "differ from cell 0" in problems and "orphan.py: no paired" in problems


def _code_cells(name):
    return [c for c in nbformat.read(notebook.NOTEBOOKS / f"{name}.ipynb", as_version=4).cells if c.cell_type == "code"]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_shape_env_report_literal_parameters_then_validation(name):
    cells = _code_cells(name)
    assert "nb.env_report()" in cells[0].source
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert tagged == [1], "exactly one parameters cell, right after the environment report"
    params = {}
    for stmt in ast.parse(cells[1].source).body:  # plain literals only: papermill does not re-derive values
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        params[stmt.targets[0].id] = ast.literal_eval(stmt.value)
    assert params["INTERACTIVE"] is False
    assert cells[2].metadata.get("tags") == ["validate"] and "nb.check_params(globals()" in cells[2].source
    call = next(n for n in ast.walk(ast.parse(cells[2].source)) if isinstance(n, ast.Call)
                and getattr(n.func, "attr", "") == "check_params")
    assert [k.value for k in call.args[1].keys] == list(params), "the spec must cover exactly the parameters"
    import papermill as pm

    assert set(pm.inspect_notebook(str(notebook.NOTEBOOKS / f"{name}.ipynb"))) == set(params)


def test_check_params_messages():
    spec = {"STEPS": nb.Int(0, 10), "MODE": nb.Choice("a", "b"), "MB": nb.Float(0.001, 64), "ON": nb.Bool(),
            "ARMS": nb.Subset("joint", "frozen_draft")}
    ok = {"STEPS": 3, "MODE": "a", "MB": 1, "ON": False, "ARMS": "joint,frozen_draft", "nb": nb, "In": [], "_": 1}
    assert nb.check_params(ok, spec) == {"STEPS": 3, "MODE": "a", "MB": 1, "ON": False, "ARMS": "joint,frozen_draft"}
    bad = {"steps": "unknown parameter 'steps' (did you mean 'STEPS'?)",
           "STEPS": "STEPS='3' is invalid: expected an integer in [0, 10]",
           "MODE": "MODE='c' is invalid: expected one of 'a', 'b'",
           "MB": "MB=True is invalid: expected a number in [0.001, 64]",
           "ARMS": "ARMS='joint,x' is invalid: expected a comma-separated list of 'joint', 'frozen_draft'"}
    values = {"steps": 3, "STEPS": "3", "MODE": "c", "MB": True, "ARMS": "joint,x"}
    for key, message in bad.items():
        with pytest.raises(ValueError) as e:
            nb.check_params({**ok, key: values[key]}, spec)
        assert str(e.value).startswith(message)
    with pytest.raises(ValueError, match="parameter 'ON' is missing"):
        nb.check_params({k: v for k, v in ok.items() if k != "ON"}, spec)


def test_record_merges_into_the_metrics_file(tmp_path, monkeypatch):
    import numpy as np

    path = tmp_path / "metrics.json"
    monkeypatch.setenv("LABKIT_METRICS", str(path))
    monkeypatch.setattr(nb, "_METRICS", {})
    nb.record("sync/verified", True)
    nb.record({"sync/gbps": np.float32(0.5), "tune/curve": [{"bucket_bytes": 1}]})
    assert json.loads(path.read_text()) == nb.metrics() == {"sync/verified": True, "sync/gbps": 0.5,
                                                             "tune/curve": [{"bucket_bytes": 1}]}


def _sync_metrics(transport="colocated", bucket=1 << 20):
    m = {f"timing/sync/{p}": 0.01 * (i + 1) for i, p in enumerate(viz.PHASES)}
    m.update({"timing/sync/total": 0.15, "sync/transport": transport, "sync/bucket_bytes": bucket,
              "sync/num_buckets": 3})
    return m


def test_figures_build_and_save(tmp_path):
    figs = {
        "phases": viz.sync_phases([_sync_metrics("per-tensor", 1), _sync_metrics()]),
        "sweep": viz.bucket_sweep([{"bucket_bytes": 1 << k, "seconds": 1.0 / k, "peak_extra_bytes": 2 << k}
                                   for k in range(16, 22)], 1 << 19, 4 << 20,
                                  trials=[{"bucket_bytes": 1 << 19, "seconds": 0.05}]),
        "curves": viz.curves([{"step": i, "train/loss": 1.0 / (i + 1), "mtp/loss": 2.0} for i in range(3)]),
        "accept": viz.acceptance([{"arm": a, "step": s, "mtp/accept_rate": 0.5, "mtp/accept_rate_pos_1": 0.5,
                                   "mtp/accept_length": 1.5, "mtp/offline_accept_rate": 0.48, "train/reward": 0.1}
                                  for a in ("frozen", "trained") for s in range(3)]),
        "logprobs": viz.logprob_agreement({"synced": {"trainer": [-0.1, -2.0], "engine": [-0.1, -2.0]}}),
        "summary": viz.sweep_summary([{"X": 1, "t": 0.2}, {"X": 2, "t": 0.1}], "X", ["t"]),
        "positions": viz.per_position({"mtp/accept_length": 2.1, "mtp/theory_accept_length": 2.2,
                                       **{f"mtp/accept_rate_pos_{i}": 0.9 - 0.1 * i for i in (1, 2, 3)}}),
    }
    figs["by_position"] = viz_positions.by_position(
        {"mtp/arms": {"frozen": [], "trained": []},
         **{f"mtp/final_loop_accept_rate_at_{lo}_{lo + 31}_{a}_mean": 0.8 - lo / 640 for lo in (32, 0, 64)
            for a in ("frozen", "trained")},
         **{f"mtp/final_loop_accept_rate_at_{lo}_{lo + 31}_frozen_ci95": [0.6, 0.9] for lo in (0, 32, 64)}})
    assert [list(t.x) for t in figs["by_position"].data] == [["0–31", "32–63", "64–95"]] * 2  # in position order
    assert figs["by_position"].data[0].error_y.array[0] == pytest.approx(0.1)
    assert list(figs["positions"].data[0].x) == [1, 2, 3] and "theory 2.200" in figs["positions"].layout.title.text
    assert len(figs["phases"].data) == len(viz.PHASES) + 1
    assert sum(s.type == "line" for s in figs["sweep"].layout.shapes) == 3  # chosen bucket / budget lines
    for name, fig in figs.items():
        out = viz.save(fig, tmp_path / name)
        assert (tmp_path / f"{name}.html").exists()
        assert out["png"] or out["png_skipped"]
    assert (tmp_path / "plotly.min.js").exists()  # HTML opens offline


def test_resolve_and_parse_value():
    assert notebook.resolve("01").name == notebook.resolve("weight_update").name == "01_weight_update.ipynb"
    with pytest.raises(ValueError, match="unknown"):
        notebook.resolve("99")
    assert [notebook.parse_value(x) for x in ("3", "0.5", "False", "colocated", "'x'")] == [3, 0.5, False,
                                                                                           "colocated", "x"]
    assert notebook.parse_value("0,1,2") == "0,1,2"  # a comma list stays the string SEEDS takes, not a tuple


def _fake_run(name, params, out_root="runs", tag=None, **kw):
    out = notebook._new_dir(__import__("pathlib").Path(out_root), f"{name}-{tag}")
    if params["BUCKET_MB"] < 0:
        raise notebook.NotebookError("bad", ename="ValueError", evalue="BUCKET_MB=-1 is invalid", out_dir=str(out))
    return {"timing/sync/total": 1.0 / params["BUCKET_MB"], "sync/verified": True, "notebook/seconds": 1.0,
            "notebook/out_dir": str(out), "sync/peak_extra_bytes": 1, "tune/curve": [1, 2]}


def test_sweep_writes_summary_table_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(notebook, "run", _fake_run)
    rc = labkit_main(["notebook", "sweep", "01", "-p", "BUCKET_MB", "0.5,1,-1", "-p", "STEPS", "1",
                      "--out-root", str(tmp_path), "--json"])
    assert rc == 1  # one value failed; the others still ran
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with open(res["sweep/summary_csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [r["BUCKET_MB"] for r in rows] == ["0.5", "1", "-1"] and [r["status"] for r in rows] == ["ok", "ok", "error"]
    assert "BUCKET_MB=-1 is invalid" in rows[2]["error"] and "tune/curve" not in rows[0]
    assert res["sweep/figure"].endswith("summary.html") and res["sweep/failed"] == 1


def _fake_mtp_run(name, params, out_root="runs", tag=None, **kw):
    out = notebook._new_dir(__import__("pathlib").Path(out_root), f"{name}-{tag}")
    m = {"tokens": 0.80, "tv": 0.85}[params["MTP_TARGET"]]
    return {"mtp/tail_accept_rate_trained_mean": m, "mtp/tail_accept_rate_trained_ci95": [m - 0.02, m + 0.01],
            "mtp/per_seed": [{"mtp/seed": int(s)} for s in params["SEEDS"].split(",")], "notebook/seconds": 1.0,
            "notebook/out_dir": str(out)}


def test_sweep_over_one_key_keeps_other_comma_values_and_saves_records(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(notebook, "run", _fake_mtp_run)
    saved = tmp_path / "data" / "sweep.json"
    argv = ["sweep", "03", "--over", "MTP_TARGET", "-p", "MTP_TARGET", "tokens,tv", "-p", "SEEDS", "0,1,2",
            "--out-root", str(tmp_path), "--save", str(saved), "--json"]
    assert labkit_main(["notebook", *argv]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rec = json.loads(saved.read_text())
    assert rec["key"] == "MTP_TARGET" and rec["values"] == ["tokens", "tv"] and rec["params"]["SEEDS"] == "0,1,2"
    assert rec["command"] == "labkit notebook " + " ".join(argv)  # the stored run says how it was made
    assert [len(r["mtp/per_seed"]) for r in rec["rows"]] == [3, 3]  # whole records: lists survive
    assert res["sweep/saved"] == str(saved)
    with open(res["sweep/summary_csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [r["MTP_TARGET"] for r in rows] == ["tokens", "tv"] and "mtp/per_seed" not in rows[0]
    assert rows[1]["mtp/tail_accept_rate_trained_ci95"]  # the interval is kept for the figure's error bars
    assert labkit_main(["notebook", "sweep", "03", "--over", "K", "-p", "MTP_TARGET", "tokens,tv"]) == 2  # no -p K


def test_sweep_summary_draws_intervals_as_error_bars():
    rows = [{"V": "a", "x_mean": 0.5, "x_ci95": [0.4, 0.7]}, {"V": "b", "x_mean": 0.6, "x_ci95": None}]
    fig = viz.sweep_summary(rows, "V", ["x_mean"])
    err = fig.data[0].error_y
    assert list(err.array) == [pytest.approx(0.2), None] and list(err.arrayminus) == [pytest.approx(0.1), None]


def test_run_cli_json_last_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(notebook, "run", _fake_run)
    assert labkit_main(["notebook", "run", "01_weight_update", "-p", "BUCKET_MB", "2", "--out-root", str(tmp_path),
                        "--json"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["timing/sync/total"] == 0.5 and last["sync/verified"] is True
    assert labkit_main(["notebook", "sweep", "01", "-p", "BUCKET_MB", "2"]) == 2  # no comma list: usage error


def test_sync_explorer_runs_only_on_the_button():
    from labkit.workbench.widgets import sync_explorer

    class FakeWorkbench:
        calls = []

        def sync(self, cfg):
            self.calls.append(cfg)
            if cfg.transport == "distributed":
                raise RuntimeError("no group")
            return {**_sync_metrics(cfg.transport, cfg.bucket_bytes), "sync/verified": True,
                    "sync/weight_version": f"v{len(self.calls)}"}

    wb = FakeWorkbench()
    ex = sync_explorer(wb, sizes_mb=(0.25, 1.0, 4.0), value_mb=0.9)
    assert ex.bucket.value == 1.0 and ex.bucket.continuous_update is False
    ex.bucket.value = 4.0  # moving the slider starts nothing
    assert wb.calls == []
    ex.button.click()
    ex.wait(10)
    assert [c.bucket_mb for c in wb.calls] == [4.0] and ex.runs[0]["sync/verified"] is True
    assert "verified=True" in ex.status.value
    (shown,) = ex.ui.children[-1].outputs  # the figure the browser draws, one bar per run
    assert shown["data"]["application/vnd.plotly.v1+json"]["data"][0]["x"] == ["colocated @ 4 MiB (3 buckets)"]
    ex.transport.value = "distributed"
    ex.button.click()  # a failing sync is reported next to the controls, the explorer keeps working
    ex.wait(10)
    assert "RuntimeError: no group" in ex.status.value and len(ex.runs) == 1 and not ex.button.disabled


def test_sync_explorer_refuses_a_press_while_a_sync_runs():
    """Issue 17: a second Run while one is going must not start a second sync on top of it."""
    import threading

    from labkit.workbench.widgets import sync_explorer

    release, started = threading.Event(), threading.Event()

    class SlowWorkbench:
        calls = 0

        def sync(self, cfg):
            SlowWorkbench.calls += 1
            started.set()
            assert release.wait(10)
            return {**_sync_metrics(cfg.transport, cfg.bucket_bytes), "sync/verified": True,
                    "sync/weight_version": f"v{SlowWorkbench.calls}"}

    ex = sync_explorer(SlowWorkbench(), sizes_mb=(0.25, 1.0), value_mb=1.0)
    ex.button.click()
    assert started.wait(10) and ex.button.disabled
    ex.button.click()  # the button may still look enabled in the browser: the kernel refuses it
    ex.button.click()
    assert ex.state.refused == 2 and "press ignored" in ex.status.value
    release.set()
    ex.wait(10)
    assert SlowWorkbench.calls == 1 and len(ex.runs) == 1 and not ex.button.disabled
    assert "verified=True" in ex.status.value and "run 1" in ex.status.value
    ex.button.click()  # after it finished, a press runs again
    ex.wait(10)
    assert SlowWorkbench.calls == 2 and len(ex.runs) == 2


def test_the_phase_stack_draws_every_phase_a_sync_times():
    """Issue 17: the stack left out setup (~0.31 s of a 1.4 s sync), so the bars did not add up to the wall."""
    from labkit.sync.inflight import PHASES

    assert set(viz.PHASES) == set(PHASES)
    fig = viz.sync_phases([{**_sync_metrics(), "sync/cold": True}, {**_sync_metrics(), "sync/cold": False}])
    assert "setup (one-off)" in [t.name for t in fig.data]
    assert [x.endswith(("cold)", "warm)")) for x in fig.data[0].x] == [True, True]
