"""Nothing a run maps may outlive it: a finished `labkit sync` or a closed Workbench leaves /dev/shm as it
found it. (Issue 16: the colocated transport's shared-memory bucket buffers, `torch_<trainer pid>_*`, stayed
behind a `labkit sync --json` until the next labkit start: twice a model's size of RAM held by nothing.)

The machine may be shared, so only files that this run's processes made count: every process started under
the run carries a marker in its environment (Ray workers and SGLang's children inherit the driver's), and
their pids are collected while the run goes on.
"""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from labkit.pids import owner
from labkit.sync.lastgood import STAGE_PREFIX
from labkit.sync.probe import LIMITS
from tests.integration.conftest import live

pytestmark = pytest.mark.integration

SHM = Path("/dev/shm")
SHM_PREFIXES = ("torch_", "sglang_loads_", "sem.mp-", "labkit_stage_")


def _marked_pids(marker: str) -> set[int]:
    out = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "environ").read_bytes():
                    out.add(int(proc.name))
            except OSError:
                continue
    return out


class PidWatch:
    """Collects, every 0.3 s until stopped, the pids of the processes whose environment carries the marker."""

    def __init__(self, marker: str):
        self.marker, self.pids, self._stop = marker, set(), threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            self.pids |= _marked_pids(self.marker)
            self._stop.wait(0.3)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=10)


def _ours(new: set[str], pids: set[int]) -> list[str]:
    """New /dev/shm entries this run left: torch files of its processes, and SGLang's/labkit's own that no live
    process holds (a held one belongs to an engine still running beside this test)."""
    from labkit.compat import sglang as compat

    out, held = [], compat._held_paths()
    for name in sorted(new):
        if str(SHM / name) in held:
            continue
        if name.startswith("torch_"):
            pid = name.split("_")[1]
            if pid.isdigit() and int(pid) in pids:
                out.append(name)
        elif name.startswith(SHM_PREFIXES[1:]):
            who = owner(name, STAGE_PREFIX) if name.startswith(STAGE_PREFIX) else None
            if who is None or who[1] in pids:
                out.append(name)
    return out


def _listing() -> set[str]:
    return {f.name for f in SHM.iterdir()}


def _settle(pids: set[int], timeout_s: float = 30.0) -> None:
    """Ray tears its workers down after the driver exits: wait (bounded) until none of the run's is alive."""
    deadline = time.monotonic() + timeout_s
    while live(pids) and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
def test_labkit_sync_colocated_leaves_dev_shm_as_it_found_it(tmp_path):
    marker = f"LABKIT_SHM_TEST={uuid.uuid4().hex}"
    env = dict(os.environ, LABKIT_SHM_TEST=marker.split("=", 1)[1])
    before = _listing()
    with PidWatch(marker) as watch:
        # The FP8 preset (docs/fp8.md): the Megatron trainer's bf16 original quantized on the way into an FP8
        # engine, verified in bytes and, with the probe, in behaviour (tests/integration/test_fp8.py: the rest)
        p = subprocess.run([sys.executable, "-m", "labkit.cli", "sync", "--transport", "colocated", "--steps", "1",
                            "--bucket-mb", "0.1", "--model", "qwen3-moe-fp8", "--probe", "8", "--json", "--out",
                            str(tmp_path / "run.json")], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads(p.stdout.strip().splitlines()[-1])
    assert m["sync/verified"] is True and m["sync/num_buckets"] > 1  # the pool's buffers were used
    assert m["timing/sync/quantize"] > 0 and 0 < m["sync/probe_kl"] < LIMITS["other"], m
    stored = json.loads((tmp_path / "run.json").read_text())  # `--out`: the run, led by the command that made it
    assert stored.pop("command").startswith("labkit sync --transport colocated")
    assert len(stored.pop("provenance")["commit"]) == 40 and stored == m  # what made it (labkit.provenance)
    assert watch.pids, "the pid watch saw none of the run's processes"
    _settle(watch.pids)
    left = _ours(_listing() - before, watch.pids)
    assert not left, f"`labkit sync` left {left} in /dev/shm"


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
def test_workbench_close_leaves_dev_shm_as_it_found_it():
    """In-process: after close() (the driver still alive, Ray still up) nothing of the run stays mapped."""
    import ray

    from labkit.cluster import runtime
    from labkit.sync import SyncConfig
    from labkit.workbench import Workbench

    started_ray = not ray.is_initialized()
    before = _listing()
    wb = Workbench()
    try:
        trainer_pids = set(ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in wb.trainer.actors]))
        wb.train(1, progress=False)
        m = wb.sync(SyncConfig(transport="colocated", bucket_mb=1, progress=False))
        assert m["sync/verified"] is True and m["sync/num_buckets"] > 1
        during = {n for n in _listing() - before if any(n.startswith(f"torch_{p}_") for p in trainer_pids)}
        assert during, "the colocated sync made no shared-memory buffers in the trainer (test premise)"
        # The owner frees its buffers itself (what Trainer.shutdown asks before killing it), not only the driver's
        # sweep after the kill: the files are gone while the trainer is still alive.
        released = ray.get([a.release.remote() for a in wb.trainer.actors], timeout=60)
        assert all(r["shm_left"] == [] for r in released), released
    finally:
        wb.close()
    try:
        left = _ours(_listing() - before, trainer_pids | {os.getpid()})
        assert not left, f"Workbench.close() left {left} in /dev/shm"
    finally:
        if started_ray:
            runtime.shutdown()
