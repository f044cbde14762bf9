"""The README's set-up commands, timed from a fresh clone: `make test` (install included) and then `make demo`, as a
new user and CI run them. Writes one JSON run with the clone's own provenance (its commit, a clean tree).

    python scripts/fresh_clone.py [--repo .] [--dir D] [--no-demo] --out data/make_test_fresh_clone_cpu.json

Keep the box otherwise idle: the suite's time is what the 45-minute budget is about. The install is timed from the
start of `make test` to the install stamp (`.venv/.labkit-installed`), `suite_s` from there to the end (the
browser's apt install, when the box has no Chromium yet, included).
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)")


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - t0


def pytest_summary(text: str) -> dict:
    """The counts of pytest's last summary line and its slowest durations."""
    last = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed).* in [\d.]+s", ln)]
    counts = {k if k != "error" else "errors": int(n) for n, k in SUMMARY.findall(last[-1])} if last else {}
    slowest = [{"seconds": float(m[1]), "phase": m[2], "test": m[3]}
               for m in (DURATION.match(ln) for ln in text.splitlines()) if m]
    return {"passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
            "errors": counts.get("errors", 0), "skipped": counts.get("skipped", 0), "slowest": slowest}


def _du(path: Path) -> int | None:
    """Bytes under `path` (None when it is not there: an install that failed before creating it)."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=".")
    ap.add_argument("--dir", default="/tmp/labkit_fresh")
    ap.add_argument("--no-demo", action="store_true", help="time make test only")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    clone = Path(a.dir)
    if clone.exists():
        raise SystemExit(f"--dir {clone} exists: a fresh clone needs an empty place")
    subprocess.run(["git", "clone", "-q", str(Path(a.repo).resolve()), str(clone)], check=True)
    prov = json.loads(subprocess.run(  # the clone's code as it starts (this interpreter, the clone's labkit)
        [sys.executable, "-c", "import json; from labkit import provenance; print(json.dumps(provenance.collect()))"],
        cwd=clone, capture_output=True, text=True, check=True).stdout)
    t0 = time.time()
    rc, test_s = timed(["make", "test"], clone, clone.parent / f"{clone.name}_make_test.log")
    stamp = clone / ".venv" / ".labkit-installed"
    install_s = stamp.stat().st_mtime - t0 if stamp.exists() else None
    out = {"command": "python scripts/fresh_clone.py " + " ".join(sys.argv[1:]),
           "provenance": prov,
           "make_test/rc": rc, "make_test/total_s": round(test_s, 1),
           "make_test/install_s": None if install_s is None else round(install_s, 1),
           "make_test/suite_s": None if install_s is None else round(test_s - install_s, 1),
           **{f"make_test/{k}": v for k, v in pytest_summary(
               (clone.parent / f"{clone.name}_make_test.log").read_text()).items()},
           "venv_bytes": _du(clone / ".venv")}
    if not a.no_demo:
        rc_demo, demo_s = timed(["make", "demo"], clone, clone.parent / f"{clone.name}_make_demo.log")
        out.update({"make_demo/rc": rc_demo, "make_demo/total_s": round(demo_s, 1)})
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("provenance", "make_test/slowest")}, indent=1))
    shutil.rmtree(clone, ignore_errors=True)
    return 0 if rc == 0 and out.get("make_demo/rc", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
