"""Every stored run the README and docs/ quote, re-made at one commit: the command each run recorded, run again
from a fresh clone of HEAD, one after the other, its output left in the clone's data/ (then copy it back and
`labkit report`). Runs made on a GPU (their provenance names one) are listed, not run: they need the device machine.

    python scripts/remake_runs.py                     # list the runs and their commands
    python scripts/remake_runs.py --run --dir D [--only NAME,...]

Keep the box otherwise idle while it runs: many of these runs are timings. Timing runs go first, the long MTP runs
last. The fresh-clone timing of `make test` (scripts/fresh_clone.py) is its own run and is not repeated here.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from labkit.lab.report.generate import QUOTED, pages  # noqa: E402

LAST = ("mtp_", "faults_cpu")  # the long runs, after every timing
SELF = ("make_test_fresh_clone",)  # scripts/fresh_clone.py times `make test` on an idle box: a run of its own
DERIVED = ("roofline_",)  # computed from other stored runs (bench sync pair, notebook 04, a held-out bench)


def quoted_runs() -> list[tuple[str, str, bool]]:
    """(file, command, made on a GPU) for every data/*.json a page names, timings first."""
    names = dict.fromkeys(f for p in pages(ROOT) for f in QUOTED.findall(p.read_text()))
    out = []
    for f in names:
        if f.startswith(SELF) or not (ROOT / "data" / f).is_file():
            continue
        run = json.loads((ROOT / "data" / f).read_text())
        cmd = run.get("command", "")
        gpu = bool(((run.get("provenance") or {}).get("host") or {}).get("gpus")) or any(
            s in cmd for s in ("--device cuda", "/root/out/", "bench device"))
        out.append((f, cmd, gpu))
    # a command that reads a model another run writes under runs/ goes after it; runs derived from runs go after
    # every timing they read
    return sorted(out, key=lambda r: (r[0].startswith(LAST), r[0].startswith(DERIVED), " runs/" in r[1], r[0]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="run them (default: list)")
    ap.add_argument("--dir", default=None, help="where to clone HEAD (must not exist)")
    ap.add_argument("--only", default=None, help="comma-separated file names (default: every CPU run)")
    a = ap.parse_args()
    runs = [r for r in quoted_runs() if a.only is None or r[0] in a.only.split(",")]
    for f, cmd, gpu in runs:
        print(f"{'[gpu, not run] ' if gpu else ''}{f}: {cmd}")
    if not a.run:
        return 0
    if not a.dir or Path(a.dir).exists():
        raise SystemExit(f"--dir {a.dir!r}: give a path that does not exist yet (a fresh clone goes there)")
    subprocess.run(["git", "clone", "-q", str(ROOT), a.dir], check=True)
    venv, failed = Path(sys.executable).parent, []
    for f, cmd, gpu in runs:
        if gpu:
            continue
        argv = shlex.split(cmd)
        argv[0] = str(venv / argv[0]) if argv[0] in ("labkit", "python") else argv[0]
        t0, log = time.monotonic(), Path(a.dir) / "runs" / f"remake_{Path(f).stem}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            rc = subprocess.run(argv, cwd=a.dir, env={**os.environ, "PYTHONPATH": a.dir}, stdout=out,
                                stderr=subprocess.STDOUT).returncode
        print(f"{f}: rc={rc} in {time.monotonic() - t0:.0f} s (log {log})", flush=True)
        failed += [f] if rc else []
    print(f"outputs in {a.dir}/data; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
