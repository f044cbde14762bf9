"""labkit.cluster.shm_manager: processes that take CPU tensors by shared-memory name from one short-lived sender
after another (an engine from restarted trainers) hold one manager socket, not one per sender, and can free a
killed sender's segment. Real processes: a receiver that is the run's driver, senders that come and go."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from labkit.cluster import shm_manager

SENDER = textwrap.dedent("""
    import base64, sys, torch
    from multiprocessing.reduction import ForkingPickler
    torch.multiprocessing.set_sharing_strategy("file_system")
    from labkit.cluster import shm_manager
    joined = shm_manager.join() if sys.argv[2] == "1" else False
    t = torch.full((4096,), float(sys.argv[1]))
    t.share_memory_()
    print(int(joined), base64.b64encode(bytes(ForkingPickler.dumps(t))).decode(), flush=True)
    sys.stdin.read()  # until killed
""")

RECEIVER = textwrap.dedent("""
    import base64, gc, json, os, pickle, subprocess, sys, psutil, torch
    torch.multiprocessing.set_sharing_strategy("file_system")
    from labkit.cluster import shm_manager
    from labkit.engine.inside import apply
    mode, joined, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if joined == "1":
        shm_manager.start()
    fds = lambda: len(os.listdir("/proc/self/fd"))
    out = {"joined": [], "equal": [], "fds": []}
    for i in range(n):
        p = subprocess.Popen([sys.executable, "-c", SENDER, str(i), joined],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        flag, blob = p.stdout.readline().split()
        t = pickle.loads(base64.b64decode(blob))
        out["joined"].append(flag == "1")
        out["equal"].append(bool(torch.equal(t, torch.full((4096,), float(i)))))
        if mode == "release":  # as Ray kills a dead worker: the sender and the manager it started
            managers = [c for c in psutil.Process(p.pid).children() if c.name() == "torch_shm_manager"]
            p.kill(); p.wait()
            for c in managers:
                c.kill()
                c.wait(10)
            out["managers_killed"] = out.get("managers_killed", 0) + len(managers)
            apply._release(t)
            out["orphans"] = len(apply._orphans)
        del t
        gc.collect()
        if mode == "fds":
            p.kill(); p.wait()
        out["fds"].append(fds())
    out["fds_added"] = out["fds"][-1] - out["fds"][0]  # after the first sender: what each later one added
    print(json.dumps(out), flush=True)
""")


def _receive(tmp_path, mode: str, joined: bool, n: int) -> dict:
    script = tmp_path / "receiver.py"
    script.write_text(f"SENDER = {SENDER!r}\n" + RECEIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    env.pop(shm_manager.ENV, None)
    r = subprocess.run([sys.executable, str(script), mode, "1" if joined else "0", str(n)], capture_output=True,
                       text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("joined", [False, True])
def test_a_receiver_holds_one_socket_however_many_senders_come_and_go(tmp_path, joined):
    out = _receive(tmp_path, "fds", joined, 3)
    assert all(out["equal"]) and out["joined"] == [joined] * 3
    # torch's own behaviour (each sender its own manager): one socket kept per sender; joined: none added
    assert out["fds_added"] == (0 if joined else 2), out


@pytest.mark.parametrize("joined", [False, True])
def test_a_killed_senders_segment_is_freed_when_its_manager_lives_and_kept_when_it_died(tmp_path, joined):
    out = _receive(tmp_path, "release", joined, 1)  # the receiver survives either way (returncode 0)
    assert all(out["equal"]) and out["managers_killed"] == (0 if joined else 1), out
    assert out["orphans"] == (0 if joined else 1), out


def test_join_without_a_run_manager_or_with_a_dead_one_keeps_torchs_behaviour(monkeypatch, tmp_path):
    monkeypatch.delenv(shm_manager.ENV, raising=False)
    assert shm_manager.join() is False
    monkeypatch.setenv(shm_manager.ENV, f"{tmp_path / 'manager.sock'}|/torch_1_2_3|8")
    assert shm_manager.join() is False and shm_manager.alive(str(tmp_path / "manager.sock")) is False
