"""What rfc3987-syntax costs a Ray process, A/B: `import ray` in a fresh process, and a Workbench's start (Ray, the
trainer, the engine), with the package importable (arm "with": installed from `--wheel` into a directory put first
on PYTHONPATH, which Ray's daemons and workers inherit) and without it (arm "without": labkit's install, where
`make install` uninstalls it). The arms alternate run by run, so the box's drift stays out of the comparison.
Writes one JSON file.

    python scripts/import_cost_ab.py --wheel rfc3987_syntax-1.1.0-py3-none-any.whl [--imports 5] [--starts 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402

SEEN = "'rfc3987_syntax' in sys.modules"
IMPORT = f"import sys, time; t = time.perf_counter(); import ray; print(time.perf_counter() - t, {SEEN})"
START = ("import sys, time; t = time.perf_counter(); from labkit.workbench import Workbench; "
         "wb = Workbench(progress=False); s = time.perf_counter() - t; wb.close(); import ray; ray.shutdown(); "
         f"print(s, {SEEN})")


def timed(code: str, env: dict) -> tuple[float, float, bool]:
    """(seconds the code reports, wall seconds of the whole process, whether rfc3987_syntax was imported)."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"{code[:40]}... failed: {out.stderr[-2000:]}")
    seconds, imported = out.stdout.strip().splitlines()[-1].split()
    return float(seconds), wall, imported == "True"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", required=True, help="the rfc3987-syntax wheel the 'with' arm installs")
    ap.add_argument("--imports", type=int, default=5)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--out", default="data/import_cost_cpu.json")
    a = ap.parse_args()
    prov = provenance.collect(config=vars(a))
    target = tempfile.mkdtemp(prefix="labkit_rfc3987_")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, a.wheel], check=True)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    repo = str(Path(__file__).resolve().parents[1])
    envs = {"with": {**base, "PYTHONPATH": f"{target}:{repo}"}, "without": {**base, "PYTHONPATH": repo}}
    rows = {arm: {"import_ray_s": [], "workbench_start_s": []} for arm in envs}
    for what, code, n in (("import_ray_s", IMPORT, a.imports), ("workbench_start_s", START, a.starts)):
        for i in range(n):
            for arm in (("with", "without") if i % 2 == 0 else ("without", "with")):
                seconds, _, imported = timed(code, envs[arm])
                if imported != (arm == "with"):  # the arms must differ in exactly this
                    raise SystemExit(f"arm {arm!r}: rfc3987_syntax imported={imported}")
                rows[arm][what].append(round(seconds, 3))
                print(arm, what, round(seconds, 2), flush=True)
    out = {"command": "python " + " ".join(sys.argv), "provenance": prov}
    for arm, r in rows.items():
        for what, xs in r.items():
            out[f"import_cost/{arm}/{what}"] = xs
            out[f"import_cost/{arm}/{what}_median"] = round(statistics.median(xs), 2)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k.endswith("_median")}, indent=1))


if __name__ == "__main__":
    main()
