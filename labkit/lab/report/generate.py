"""Tables generated from the stored runs in data/ (`labkit report`; `--check` fails when one is stale or cannot be
built).

A table lives between `<!-- table:NAME -->` and `<!-- /table:NAME -->` in README.md or in a page under docs/, and is
rebuilt there from `data/<file>` with the command that made the run, so a number in the docs is always one a stored
run holds. Each table is written into whichever page holds its marker; `--check` reads every page, and a table
whose data file is missing, a marker no table answers, or a table placed in no page is a problem, not a skip.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from labkit import provenance
from labkit.lab.report.bench import bench_table, family_syncs_table, repeats_table, resharding_table
from labkit.lab.report.device import device_table
from labkit.lab.report.mtp import draft_inputs_table, drafts_table, engine_table, long_table, mtp_table
from labkit.lab.report.replication import replication_table
from labkit.lab.report.soak import soak_table
from labkit.lab.report.tables import (codec_table, delta_table, faults_table, host_threads_table,
                                      roofline_fit_table, roofline_models_table, roofline_table, serve_table)
from labkit.lab.roofline.overheads import stored_pairs

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "data"
MARKER = re.compile(r"(<!-- table:([\w.-]+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)


TABLES = {"mtp": ("mtp_experiment_cpu.json", mtp_table),
          "mtp-objectives": ("mtp_sweep_*.json", drafts_table), "faults": ("faults_cpu.json", faults_table),
          "mtp-replication": ("mtp_replication_*.json", replication_table),
          "serve-sync": ("bench_serve_sync*_cpu.json", serve_table),
          "bench-sync": ("bench_sync_cpu.json", bench_table), "bench-delta": ("bench_delta_cpu.json", delta_table),
          "bench-sync-moe": ("bench_sync_moe_cpu.json", bench_table),
          "bench-sync-moonlight": ("bench_sync_moonlight_cpu.json", bench_table),
          "bench-sync-fp8": ("bench_sync_fp8_cpu.json", bench_table),
          "bench-sync-fp8-bf16": ("bench_sync_fp8_bf16_cpu.json", bench_table),
          "bench-sync-repeats": ("bench_sync_cpu_2.json", repeats_table),
          "bench-codec": ("bench_codec_*.json", codec_table),
          "device-check": ("device_check_*.json", device_table),
          "family-syncs": ("sync_*_cpu.json", family_syncs_table),
          "resharding": ("reshard_*_cpu.json", resharding_table),
          "draft-inputs": ("draft_inputs_ab_cpu.json", draft_inputs_table),
          "mtp-engine": ("mtp_engine_counters_cpu.json", engine_table),
          "mtp-long": ("mtp_long_chain_cpu.json", long_table),
          "host-threads": ("host_threads_ab_cpu.json", host_threads_table),
          "roofline": ("roofline_published.json", roofline_table),
          "roofline-models": ("roofline_published.json", roofline_models_table),
          "roofline-fit": ("roofline_published.json", roofline_fit_table),
          "soak": ("soak_cpu.json", soak_table)}


# several runs of one bench, not paired with the MTP run
MULTI = {"bench-codec", "family-syncs", "serve-sync", "device-check", "resharding"}
PAIRS = {"bench-sync-repeats"}  # every stored run of the bench pair (labkit.lab.roofline.overheads.stored_pairs)


def _runs(data_dir: Path, pattern: str) -> tuple[list[tuple[str, dict]], dict]:
    """The stored runs matching `pattern` and the default MTP run they pair with."""
    return _load(data_dir, pattern), json.loads((data_dir / "mtp_experiment_cpu.json").read_text())


def _load(data_dir: Path, pattern: str) -> list[tuple[str, dict]]:
    return [(p.name, json.loads(p.read_text())) for p in sorted(data_dir.glob(pattern))]


def sources(name: str, data_dir: Path) -> list[tuple[str, dict]]:
    """The stored runs table `name` is built from, as (file name, run)."""
    file = TABLES[name][0]
    if name in PAIRS:
        return [(p.name, json.loads(p.read_text())) for pair in stored_pairs(data_dir) for p in pair]
    if "*" in file:
        runs = _load(data_dir, file)
        return runs if name in MULTI else [*runs, ("mtp_experiment_cpu.json", _runs(data_dir, file)[1])]
    return [(file, json.loads((data_dir / file).read_text()))]


def made_by(file: str, run: dict) -> str:
    """One line on where a stored run comes from: its commit and whether the tree was clean, date, machine."""
    p = run.get("provenance")
    if not isinstance(p, dict):
        commit = run.get("commit")  # runs stored before labkit.provenance: what they recorded themselves
        return (f"`data/{file}`: commit `{commit[:10]}`, tree state not recorded" if commit else
                f"`data/{file}`: no provenance recorded (stored before labkit recorded it)")
    h = p.get("host", {})
    gpus = f", {', '.join(h['gpus'])}" if h.get("gpus") else ""
    state = "clean" if p.get("dirty") is False else "DIRTY" if p.get("dirty") else "tree state unknown"
    return (f"`data/{file}`: commit `{(p.get('commit') or '?')[:10]}` ({state}), {p.get('date_utc', '?')[:10]}, "
            f"{h.get('cores', '?')} cores {h.get('cpu_model', '?')}, {h.get('memory_gib', '?')} GiB{gpus}")


def render(name: str, data_dir: Path) -> str:
    """The table, the commands that made its runs, and where each run comes from (`made_by`)."""
    return _body(name, data_dir) + "\n\n" + "<br>".join(made_by(f, r) for f, r in sources(name, data_dir))


def _body(name: str, data_dir: Path) -> str:
    file, fn = TABLES[name]
    if name in PAIRS:
        files = stored_pairs(data_dir)
        pairs = [(json.loads(d.read_text()), json.loads(m.read_text())) for d, m in files]
        made = "; ".join(f"`data/{p.name}`" for pair in files for p in pair)
        cmds = sorted({r.get("command", "?").split(" --out")[0] for pair in pairs for r in pair})
        return "\n".join([*fn(pairs), "", f"(from {made}, made by {' and '.join(f'`{c}`' for c in cmds)} with "
                          "`--out` naming each file; regenerate with `labkit report`)"])
    if "*" in file:  # several runs, each with its own command
        if name in MULTI:  # one bench's runs, a block of rows each
            runs = _load(data_dir, file)
            made = "; ".join(f"`data/{f}` by `{r.get('command', '?')}`" for f, r in runs)
            return "\n".join([*fn(runs), "", f"(from {made}; regenerate with `labkit report`)"])
        # beside the default MTP run they pair with
        runs, base = _runs(data_dir, file)
        made = "; ".join(f"`data/{f}` by `{r.get('command', '?')}`" for f, r in runs)
        role = "the original run" if name == "mtp-replication" else "frozen"
        return "\n".join([*fn({"runs": runs, "baseline": base}), "", f"(from {made}; {role} from "
                          f"`data/mtp_experiment_cpu.json`; regenerate with `labkit report`)"])
    run = json.loads((data_dir / file).read_text())
    cmd = run.get("command", "?")
    return "\n".join([*fn(run), "", f"(from `data/{file}`, made by `{cmd}`; regenerate with `labkit report`)"])


def missing(name: str, data_dir: Path) -> list[str]:
    """What table `name` needs from `data_dir` and does not find there (empty when it can be built)."""
    file = TABLES[name][0]
    if name in PAIRS:  # every stored run of the bench pair, both halves of each
        try:
            stored_pairs(data_dir)
        except ValueError as e:
            return [str(e)]
        return []
    needs = [file] + (["mtp_experiment_cpu.json"] if "*" in file and name not in MULTI else [])
    return [f"data/{f}" for f in needs if not (any(data_dir.glob(f)) if "*" in f else (data_dir / f).exists())]


QUOTED = re.compile(r"(?<![\w/.-])data/([\w.-]+\.json)")


def unbacked(text: str, where: str, data_dir: Path) -> list[str]:
    """Every `data/<file>.json` a page names, in a table's footer or in its prose, must be there and carry the
    provenance of a clean commit (labkit.provenance.problems): a quoted number whose run cannot say what code made
    it, or that was made from edits no commit holds, is a problem, not a footnote."""
    out = []
    for f in dict.fromkeys(QUOTED.findall(text)):
        path = data_dir / f
        why = ["missing"] if not path.is_file() else provenance.problems(json.loads(path.read_text()))
        if why:
            out.append(f"data/{f} (named in {where}): {', '.join(why)}")
    return out


def pages(root: Path | None = None) -> list[Path]:
    """The pages that may hold tables: README.md and every docs/**/*.md under `root` (the repository)."""
    root = ROOT if root is None else Path(root)
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.is_file()]


def update(check: bool = False, root: Path | None = None, data_dir: Path | None = None) -> list[str]:
    """Rebuild every table block of README.md and docs/**/*.md from the stored runs, each in the page that holds
    its marker; with `check`, write nothing. Returns the problems: the name of each stale table, and `NAME: why`
    for a table that cannot be built (a data file it needs is missing), a marker no table answers, a table
    placed in no page, or a run a page names that is missing or lacks a clean commit's provenance (`unbacked`).
    [] when every page is current."""
    data_dir = Path(data_dir) if data_dir is not None else DATA if root is None else Path(root) / "data"
    root = ROOT if root is None else Path(root)
    problems: list[str] = []
    built: dict[str, str | None] = {}  # one render per table, whichever pages hold it
    placed: set[str] = set()

    def note(problem: str) -> None:
        if problem not in problems:
            problems.append(problem)

    for page in pages(root):
        where = page.relative_to(root).as_posix()

        def rebuild(m: re.Match) -> str:
            name, body = m.group(2), m.group(3)
            placed.add(name)
            if name not in TABLES:
                note(f"{name}: no such table (marker in {where})")
                return m.group(0)
            if name not in built:
                gone = missing(name, data_dir)
                if gone:
                    note(f"{name}: cannot be built for {where}: {', '.join(gone)} missing")
                built[name] = None if gone else render(name, data_dir) + "\n"
            if built[name] is None:
                return m.group(0)
            if body != built[name]:
                note(name)
            return m.group(1) + built[name] + m.group(4)

        text = page.read_text()
        new = MARKER.sub(rebuild, text)
        if new != text and not check:
            page.write_text(new)
        for problem in unbacked(new, where, data_dir):
            note(problem)
    for name in TABLES:
        if name not in placed:
            note(f"{name}: in no page (no `<!-- table:{name} -->` in README.md or docs/)")
    return problems


def figures(data_dir: Path = DATA, out_dir: Path = ROOT / "docs" / "figures") -> dict:
    """The docs' figures, drawn from the same stored runs as their tables: {file: path written, or why not}.
    PNG only (kaleido with a Chromium it can drive); without one the tables still stand and the reason is said."""
    from labkit.workbench import viz
    from labkit.lab.report.mtp import draft_rows

    from labkit.workbench import viz_soak

    out, figs = {}, {}
    if any(data_dir.glob("mtp_sweep_*.json")):
        figs["mtp_draft_schedules.png"] = viz.draft_schedules(draft_rows(*_runs(data_dir, "mtp_sweep_*.json")))
    if (data_dir / "mtp_long_chain_cpu.json").is_file():
        from labkit.workbench import viz_positions

        long = json.loads((data_dir / "mtp_long_chain_cpu.json").read_text())
        figs["mtp_long_by_position.png"] = viz_positions.by_position(
            long.get("metrics", long), title="Long answers: draft acceptance by position (labkit's loop, T = 1)")
    if (data_dir / "soak_cpu.json").is_file():
        soak = json.loads((data_dir / "soak_cpu.json").read_text())
        figs.update({"soak_memory.png": viz_soak.memory(soak), "soak_sync_times.png": viz_soak.sync_times(soak)})
    for name, fig in figs.items():
        path = out_dir / name
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            fig.write_image(path, scale=1.5)
            out[path.name] = str(path)
        except Exception as e:  # no kaleido or no browser it can start: say so, keep the old figure
            out[path.name] = f"not drawn: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return out
