"""Trainer and engine on different Ray nodes (issue 18): a cluster of several raylets on this host
(labkit.cluster.local: all on 127.0.0.1, token auth, each node with its own custom resource), reached the way a
user reaches a real cluster, through RAY_ADDRESS (`labkit sync --placement disaggregated --trainer-resource ...`
builds the same PlacementSpec from its flags: tests/unit).

The cluster runs in its own process (the test session's own local Ray keeps running beside it); each command
is a fresh driver process that attaches to it.
"""

import json
import os
import secrets
import signal
import subprocess
import sys

import psutil
import pytest

from labkit.compat import loopback
from tests.integration.test_loopback import _join

pytestmark = pytest.mark.integration




@pytest.fixture(scope="module")
def cluster():
    """Two nodes: `trainer` (head) and `engine`. Yields the environment a driver needs to attach."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    proc = subprocess.Popen([sys.executable, "-m", "labkit.cluster.local", "--node", "trainer=4", "--node",
                             "engine=4"], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()  # blocks until the nodes are up (or the launcher died: "")
        assert line.startswith("RAY_ADDRESS="), f"launcher said {line!r}, exit {proc.poll()}"
        yield env | {"RAY_ADDRESS": line.strip().split("=", 1)[1]}, proc
    finally:
        tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(tree, timeout=30)
        for p in alive:
            p.kill()
        assert not alive, f"the launcher left {[p.name() for p in alive]} running"


def test_the_nodes_listen_on_loopback_and_want_the_token(cluster):
    env, proc = cluster
    found = loopback.listeners(proc.pid)  # the launcher and every node's processes
    assert len({x["pid"] for x in found}) >= 4 and not loopback.exposed(found), found
    address = env["RAY_ADDRESS"]
    assert "JOINED" in _join(address, env).stdout
    stranger = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    assert "JOINED" not in _join(address, stranger).stdout


def test_a_colocated_sync_is_refused_one_broadcast_reaches_both_engines_and_a_dead_one_is_fenced(cluster):
    """One driver (tests/integration/multinode_driver.py), trainer pinned to one node, two engines to the other:

    - a colocated sync across nodes is refused before a byte moves, both engines unchanged;
    - one weight-update group of both engines (the rendezvous is the trainer node's address as Ray reports it),
      each verified bitwise, and the engine answers greedy prompts as the trainer does;
    - engine 1's scheduler exits mid-sync: it is fenced, engine 0 is restored, retried, and serves the new
      version, token for token what the trainer says."""
    r = subprocess.run([sys.executable, "-m", "tests.integration.multinode_driver"], env=cluster[0],
                       capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "refused" in out["colocated"] and "must share a node" in out["colocated"], out["colocated"]
    assert out["unchanged_after_refusal"] is True and out["versions_after_refusal"] == ["default", "default"]
    m = out["broadcast"]
    assert m["sync/verified"] is True and out["greedy_after_broadcast"] is True, m
    assert m["sync/engines_synced"] == [0, 1] and m["sync/engine/0/verified"] and m["sync/engine/1/verified"], m
    assert m["timing/sync/engine/0/calls"] > 0 and m["timing/sync/engine/1/calls"] > 0, m
    assert m["sync/cross_node"] is True and m["sync/trainer_node"] != m["sync/engine_node"], m
    m = out["crash"]
    assert m["sync/engines_synced"] == [0] and m["sync/engines_fenced"] == [1] and m["sync/attempts"] == 2, m
    assert m["sync/verified"] is True and m["sync/engine/0/verified"] is True and len(m["sync/errors"]) == 1
    assert out["live_version"] == "r2" and out["greedy_after_crash"] is True
