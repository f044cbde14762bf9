"""labkit.lab.soak.resources on real processes: a child that grows, opens files and starts threads is seen under
its root with the growth; /dev/shm files are counted with their bytes; no Ray, no object store reading."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.lab.soak import resources

CHILD = """
import sys, threading, time
blob = bytearray(64 << 20)  # touched: resident
for i in range(0, len(blob), 4096):
    blob[i] = 1
files = [open(sys.argv[1], "rb") for _ in range(5)]
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
stop.set()
"""


def test_a_child_is_seen_under_its_root_with_what_it_holds_and_left_out_once_gone(tmp_path):
    before = {p["pid"]: p for p in resources.processes([os.getpid()])}
    assert before[os.getpid()]["role"] == "driver"
    child = subprocess.Popen([sys.executable, "-c", CHILD, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        seen = {p["pid"]: p for p in resources.processes([os.getpid(), os.getpid()])}  # each process once
        c = seen[child.pid]
        assert c["rss_bytes"] > 64 << 20 and c["fds"] >= 5 + 3 and c["threads"] >= 4
        assert c["role"] == Path(sys.executable).name or c["role"].startswith("python")
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=30)
    time.sleep(0.1)
    assert child.pid not in {p["pid"] for p in resources.processes([os.getpid()])}  # gone, not a zero row
    assert resources.processes([child.pid]) == []


def test_shm_counts_files_and_bytes_and_no_ray_means_no_object_store(tmp_path, monkeypatch):
    import ray

    empty = resources.shm(tmp_path)
    assert empty == {"files": 0, "bytes": 0}
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "b").write_bytes(b"y" * 24)
    (tmp_path / "sub").mkdir()
    assert resources.shm(tmp_path) == {"files": 2, "bytes": 1024}
    assert resources.shm(tmp_path / "missing") == {"files": 0, "bytes": 0}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the suite's engine fixture may hold Ray in-process
    assert resources.object_store() is None


def test_roles_follow_a_role_by_its_title_and_a_native_daemon_by_its_executable():
    v = "/x/.venv/lib/python3.11/site-packages/ray"
    assert resources.role_of([f"{v}/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/s",
                              f"--python_worker_command=/x/python {v}/_private/workers/setup_worker.py"],
                             "raylet") == "raylet"
    assert resources.role_of(["/x/.venv/bin/python", "-u", f"{v}/_private/log_monitor.py", "--session-dir=/t"],
                             "python") == "ray log_monitor"
    assert resources.role_of(["sglang::scheduler", ""], "python") == "scheduler"
    assert resources.role_of(["ray::DashboardAgent"], "python") == "ray DashboardAgent"
    assert resources.role_of(["ray::TrainerRank.train_step()"], "python") == "trainer rank"
    assert resources.role_of(["ray::IDLE"], "python") == "ray IDLE"
    assert resources.role_of(["/x/python", "-m", "sglang.launch_server", "--tp-size", "1"], "python") == "http server"
    assert resources.role_of([], "torch_shm_manager") == "torch_shm_manager"


def test_an_object_being_deleted_is_waited_for_and_one_still_held_is_read(monkeypatch):
    readings = iter([{"bytes": 700_000, "objects": 1}, {"bytes": 0, "objects": 0}])
    monkeypatch.setattr(resources, "object_store", lambda: next(readings))
    monkeypatch.setattr(resources.time, "sleep", lambda s: None)
    assert resources.settled_object_store() == {"bytes": 0, "objects": 0}
    monkeypatch.setattr(resources, "object_store", lambda: {"bytes": 5, "objects": 1})
    assert resources.settled_object_store() == {"bytes": 5, "objects": 1}  # held: it stays in the reading


STORE = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 32 << 20)
arena = mmap.mmap(fd, 32 << 20)  # mapped like Ray's plasma arena: a shared file under /dev/shm
for i in range(0, 16 << 20, 4096):  # half of it read
    arena[i]
print("ready", flush=True)
sys.stdin.readline()
for i in range(16 << 20, 24 << 20, 4096):  # then more of it
    arena[i]
print("ready", flush=True)
sys.stdin.readline()
"""


def test_the_object_store_pages_a_process_maps_are_counted_apart(tmp_path):
    shm = resources.SHM if resources.SHM.is_dir() else tmp_path
    path = shm / f"plasma_labkit_test_{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", STORE, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    plain = subprocess.Popen(["sleep", "60"])
    try:
        assert child.stdout.readline().strip() == "ready"
        store = resources.StorePages()
        seen = {p["pid"]: p for p in resources.processes([child.pid], store)}[child.pid]
        assert 16 << 20 <= seen["store_pages_bytes"] < 20 << 20 <= seen["rss_bytes"]
        assert resources.store_pages(plain.pid) == 0  # a process that maps no store (this one may: a Ray driver)
        with pytest.MonkeyPatch.context() as mp:  # the same shared pages: the reading kept, smaps not read
            mp.setattr(resources, "store_pages", lambda pid: pytest.fail("smaps read again, nothing changed"))
            assert store(child.pid, seen["shared_bytes"]) == seen["store_pages_bytes"]
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ready"
        again = {p["pid"]: p for p in resources.processes([child.pid], store)}[child.pid]
        assert 24 << 20 <= again["store_pages_bytes"] < 28 << 20  # its shared pages changed: read again
    finally:
        plain.kill()
        plain.wait(timeout=10)
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=30)
        path.unlink(missing_ok=True)
    assert resources.store_pages(child.pid) == 0  # gone: nothing, not an error


def test_a_thread_that_comes_and_goes_is_named_not_only_counted():
    import threading

    before, stop = resources.thread_names(), threading.Event()
    t = threading.Thread(target=stop.wait, name="labkit-probe_12", daemon=True)
    t.start()
    during, tasks = resources.thread_names(), len(os.listdir("/proc/self/task"))
    stop.set()
    t.join(timeout=10)
    assert during - before == {"labkit-probe_#": 1}  # a pool's index is not part of the name
    assert sum(during.values()) == tasks and during["MainThread"] == 1  # every thread, once
    assert resources.thread_names() == before
