"""What made a stored run: the code (commit, and whether the tree differed from it), when, on what machine, with
which libraries. Every `--out` file carries it (`labkit.cli.output.write_run`), and `labkit report --check` refuses a
table made from a run without it or from a dirty tree, so "same code", "this box" and "re-run at the current
commit" can be checked from the file alone.

Light on purpose: no torch, Ray or SGLang import (the versions come from the installed distributions' metadata, a
GPU's name from torch only when the run already imported it), so `--out` costs nothing a run would notice.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = ("torch", "sglang", "megatron-core", "mbridge", "ray", "transformers")
# Files whose changes do not change what a run measures: the stored runs themselves and the prose around them.
NOT_CODE = (":(exclude)data", ":(exclude)docs", ":(exclude)*.md")
# Written beside the code before a tree travels without its .git (the device machine): the commit, then every code
# file's git blob id at that commit, so the far side can tell by hashing whether the tree that ran is that commit.
MANIFEST = ".labkit-tree"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _is_code(path: str) -> bool:
    return not (path.startswith(("data/", "docs/")) or path.endswith(".md"))


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_manifest() -> Path:
    """The manifest of HEAD (`MANIFEST`) for a tree about to travel without its .git: `python -m labkit.provenance`
    before a device run. It names the commit's blobs, not the working tree's, so a dirty tree reads dirty there."""
    commit, listing = _git("rev-parse", "HEAD"), _git("ls-tree", "-r", "--full-tree", "HEAD")
    if commit is None or listing is None:
        raise RuntimeError(f"no git checkout at {ROOT}: a manifest needs one")
    rows = [line for line in listing.splitlines() if _is_code(line.split("\t", 1)[1])]
    path = ROOT / MANIFEST
    path.write_text("\n".join([commit, *rows]) + "\n")
    return path


def _manifest_state(path: Path) -> dict:
    """The code state of a tree that travelled with a manifest: dirty when a listed code file is missing or its
    bytes are not the commit's blob."""
    commit, *rows = path.read_text().splitlines()
    for row in rows:
        meta, name = row.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind != "blob":
            continue
        f = ROOT / name
        try:
            data = os.readlink(f).encode() if mode == "120000" else f.read_bytes()
        except OSError:
            return {"commit": commit, "dirty": True}
        if _blob_id(data) != blob:
            return {"commit": commit, "dirty": True}
    return {"commit": commit, "dirty": False}


def code_state() -> dict:
    """`commit` and `dirty`: a tracked file outside data/, docs/ and *.md differs from the commit, so the commit
    alone does not say what ran (None: not known). Outside a git checkout (a tree that travelled to the device
    machine, which may carry a .git of an older HEAD) they come from the manifest written before it left, where
    its check file by file finds the tree clean; without either, the commit is LABKIT_COMMIT's, the state unknown.
    A manifest can only show a tree clean by its bytes, so a stale one left behind changes nothing."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        state = {"commit": os.environ.get("LABKIT_COMMIT"), "dirty": None}
    else:
        changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *NOT_CODE)
        state = {"commit": commit, "dirty": None if changed is None else bool(changed)}
    if state["dirty"] is not False and (ROOT / MANIFEST).is_file():
        travelled = _manifest_state(ROOT / MANIFEST)
        if travelled["dirty"] is False or commit is None:
            return travelled
    return state


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict:
    """The machine: name, CPU model, cores, memory, and GPUs where torch is loaded and sees some."""
    import psutil

    gpus: list[str] = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"name": platform.node(), "cpu_model": _cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "gpus": gpus}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        out["labkit"] = metadata.version("labkit")
    except metadata.PackageNotFoundError:
        out["labkit"] = None
    return out


def collect(config: dict | None = None, seeds: dict | list | None = None) -> dict:
    """The provenance block of a stored run: code state, UTC date, host, versions, and what the caller passes
    (the run's full config, the seeds it used)."""
    out = {**code_state(), "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": host(), "versions": versions()}
    if config is not None:
        out["config"] = config
    if seeds is not None:
        out["seeds"] = seeds
    return out


def problems(run: dict) -> list[str]:
    """Why a stored run cannot back a published table: no provenance, no commit, or a dirty tree."""
    p = run.get("provenance")
    if not isinstance(p, dict):
        return ["no provenance"]
    out = []
    if not p.get("commit"):
        out.append("no commit")
    if p.get("dirty") is not False:
        out.append("made from a dirty tree" if p.get("dirty") else "tree state unknown")
    return out


if __name__ == "__main__":
    print(write_manifest())
