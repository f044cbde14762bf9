"""Headless notebook runs and sweeps (papermill), and the check that keeps notebooks paired and stripped.

    labkit notebook run NAME [-p KEY VALUE]... [--json]      -> runs/<UTC time>-NAME/
    labkit notebook sweep NAME -p KEY v1,v2,... [--json]     -> runs/<UTC time>-NAME-sweep-KEY/ + summary.csv/.html
    labkit notebook sweep NAME --over KEY -p KEY v1,v2 -p SEEDS 0,1,2 [--save data/F.json]
    labkit notebook list | check

A run folder holds the executed notebook, metrics.json (everything the notebook passed to labkit.workbench.nb.record)
and the figures it showed (HTML, PNG when kaleido can render). With --json the last stdout line is one object.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import json
import os
import re
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SUMMARY_KEYS = ("timing/sync/total", "sync/gbps", "sync/peak_extra_bytes", "rollout/reward_after",
                "rollout/logprob_max_abs_diff_synced", "tune/best_seconds")
TAIL_ACCEPT = re.compile(r"mtp/tail_accept_rate_\w+_mean")  # notebook 03: every arm's last-quarter acceptance


class NotebookError(RuntimeError):
    """A cell raised. `evalue` is the notebook's own message (e.g. the parameter validation error)."""

    def __init__(self, message: str, *, ename: str = "", evalue: str = "", cell_tags: tuple = (),
                 out_dir: str | None = None):
        super().__init__(message)
        self.ename, self.evalue, self.cell_tags, self.out_dir = ename, evalue, tuple(cell_tags), out_dir


def names() -> list[str]:
    return sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


def resolve(name: str) -> Path:
    """`01_weight_update`, `01` or `weight_update` -> notebooks/01_weight_update.ipynb."""
    exact = NOTEBOOKS / f"{Path(name).stem}.ipynb"
    if exact.exists():
        return exact
    hits = [n for n in names() if n.startswith(name + "_") or n.endswith("_" + name)]
    if len(hits) != 1:
        raise ValueError(f"notebook {name!r} is {'ambiguous' if hits else 'unknown'}: expected one of "
                         f"{', '.join(names())}")
    return NOTEBOOKS / f"{hits[0]}.ipynb"


def parse_value(text: str):
    """CLI value -> Python scalar literal when it is one (3, 0.5, True, None, "x"), else the plain string: "0,1,2"
    stays the string the notebook's comma-list parameters take (literal_eval would make it a tuple)."""
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return v if _scalar(v) else text


def _ipc_kernel(sockets: str):
    """The kernel's five ZMQ channels as ipc:// sockets in `sockets` (a short path: Unix sockets allow ~107 bytes),
    not TCP ports: a headless run then listens on no port at all, and ipykernel has nothing to warn about
    ("Kernel is running over TCP without encryption", one line of every run's output otherwise)."""
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "k")}})


@contextlib.contextmanager
def _env(**kv):
    # The kernel is a child process: it inherits os.environ at start, so set it around the run and restore.
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update({k: v for k, v in kv.items() if v is not None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _new_dir(root: Path, stem: str) -> Path:
    t = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = root / f"{t}-{stem}"
    out, i = base, 1
    while out.exists():
        i += 1
        out = Path(f"{base}-{i}")
    out.mkdir(parents=True)
    return out


def run(name: str, params: dict | None = None, out_root: str | Path = "runs", tag: str | None = None,
        timeout: int | None = 1800, log_output: bool = False, progress: bool = False) -> dict:
    """Execute notebooks/<name>.ipynb headless into <out_root>/<UTC time>-<name>/ and return its recorded metrics.

    Raises NotebookError (with the failing cell's message, e.g. the parameter check) when a cell raises.
    """
    import papermill as pm

    src = resolve(name)
    out_dir = _new_dir(Path(out_root), src.stem + (f"-{_slug(tag)}" if tag else ""))
    out_nb, metrics_path = out_dir / src.name, out_dir / "metrics.json"
    params = {"INTERACTIVE": False, **(params or {})}
    t0 = time.perf_counter()
    env = {"LABKIT_METRICS": str(metrics_path.resolve()), "LABKIT_OUT": str(out_dir.resolve()),
           "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", "5"), "PYTHONPATH": _pythonpath()}
    try:
        with _env(**env), tempfile.TemporaryDirectory(prefix="lk-kernel-") as sockets:
            pm.execute_notebook(str(src), str(out_nb), parameters=params, kernel_name="python3", cwd=str(out_dir),
                                progress_bar=progress, log_output=log_output, execution_timeout=timeout,
                                config=_ipc_kernel(sockets))
    except pm.PapermillExecutionError as e:
        tags = _failed_cell_tags(out_nb)
        where = f"the {tags[0]} cell" if tags else f"cell In [{e.exec_count}]"
        raise NotebookError(f"notebook {src.stem} failed at {where}: {e.ename}: {e.evalue}\n"
                            f"executed notebook: {out_nb}", ename=e.ename, evalue=e.evalue, cell_tags=tags,
                            out_dir=str(out_dir)) from None
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    metrics.update({"notebook/name": src.stem, "notebook/out_dir": str(out_dir),
                    "notebook/seconds": round(time.perf_counter() - t0, 2)})
    metrics_path.write_text(json.dumps(metrics, indent=1, sort_keys=True))
    return metrics


def _pythonpath() -> str:
    # The kernel must import this labkit even when it is not installed into the kernel's environment.
    root = str(NOTEBOOKS.parent)
    rest = os.environ.get("PYTHONPATH")
    return root if not rest else f"{root}{os.pathsep}{rest}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text)[:60]


def _failed_cell_tags(path: Path) -> tuple:
    import nbformat

    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):  # no notebook written (the kernel never started): no tags to report
        return ()
    for c in nb.cells:
        if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.get("outputs", [])):
            return tuple(c.metadata.get("tags", ()))
    return ()


def sweep(name: str, key: str, values: list, params: dict | None = None, out_root: str | Path = "runs",
          timeout: int | None = 1800, save: str | Path | None = None, command: str | None = None) -> dict:
    """One run per value of `key`; writes summary.csv and summary.html (one panel per headline metric, with its
    95 % interval where the notebook records one).

    A failing run becomes a row with its error; the sweep goes on. `save`: also a JSON file with the command and
    every run's whole record (lists too, e.g. per-seed rows), for results that are quoted (data/). Returns rows,
    paths and the failure count.
    """
    from labkit import provenance
    from labkit.workbench import viz

    src = resolve(name)
    root = _new_dir(Path(out_root), f"{src.stem}-sweep-{_slug(key)}")
    prov = provenance.collect(config={**(params or {}), key: values})  # the code as the sweep starts, not as it ends
    rows, records = [], []
    for v in values:
        row = {key: v}
        try:
            m = run(src.stem, {**(params or {}), key: v}, out_root=root, tag=f"{key}={v}", timeout=timeout)
            row.update({"status": "ok", **{k: x for k, x in m.items() if _scalar(x) or _interval(k, x)}})
            records.append({key: v, "status": "ok", **m})
        except NotebookError as e:
            row.update({"status": "error", "error": f"{e.ename}: {e.evalue}", "notebook/out_dir": e.out_dir})
            records.append(dict(row))
        rows.append(row)
    if save:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        Path(save).write_text(json.dumps({"command": command, "provenance": prov,
                                          "notebook": src.stem, "key": key, "values": values,
                                          "params": params or {}, "rows": records}, indent=1, default=str))
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(root / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    numeric = [k for k in cols if any(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                                      for r in rows) and k != key]
    shown = [k for k in SUMMARY_KEYS if k in numeric] + [k for k in numeric if TAIL_ACCEPT.fullmatch(k)]
    shown = shown or [k for k in numeric if not k.startswith("notebook/")][:3]
    fig = viz.sweep_summary(rows, key, shown + ["notebook/seconds"], title=f"{src.stem}: sweep over {key}")
    saved = viz.save(fig, root / "summary")
    return {"sweep/out_dir": str(root), "sweep/summary_csv": str(root / "summary.csv"), "sweep/figure": saved["html"],
            "sweep/failed": sum(r["status"] != "ok" for r in rows), "sweep/saved": str(save) if save else None,
            "sweep/rows": rows}


def _scalar(x) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def _interval(key: str, x) -> bool:
    """A `<metric>_ci95` value, [low, high]: kept so the summary can draw it."""
    return key.endswith("_ci95") and isinstance(x, list) and len(x) == 2 and all(isinstance(v, (int, float)) for v in x)


def check_pairs(folder: Path = NOTEBOOKS) -> list[str]:
    """Problems that keep notebooks from being reviewable: outputs left in an .ipynb, or an .ipynb and its
    py:percent twin out of sync (cell types, sources, tags). Empty list = all good."""
    import jupytext
    import nbformat

    problems = []
    for ipynb in sorted(folder.glob("*.ipynb")):
        nb = nbformat.read(ipynb, as_version=4)
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None):
                problems.append(f"{ipynb.name}: cell {i} has outputs or an execution count (strip outputs)")
        py = ipynb.with_suffix(".py")
        if not py.exists():
            problems.append(f"{ipynb.name}: no paired {py.name} (jupytext --set-formats ipynb,py:percent)")
            continue
        a, b = _cells(nb), _cells(jupytext.read(py))
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(f"{ipynb.name} and {py.name} differ from cell {i}: run `jupytext --sync {ipynb}`")
    for py in sorted(folder.glob("*.py")):
        if not py.with_suffix(".ipynb").exists():
            problems.append(f"{py.name}: no paired .ipynb (jupytext --sync {py})")
    return problems


def _cells(nb) -> list[tuple]:
    return [(c.cell_type, c.source.strip(), tuple(sorted(c.metadata.get("tags", ())))) for c in nb.cells]
