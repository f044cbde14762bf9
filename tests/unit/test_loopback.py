"""labkit.compat.loopback without Ray: stores and sockets bind the address they are given, never the wildcard."""

import os
import socket
from datetime import timedelta

import pytest

from labkit.compat import loopback


def test_tcp_store_master_listens_on_loopback_only():
    store = loopback.tcp_store("127.0.0.1", 0, 2, True, timedelta(seconds=10))
    client = loopback.tcp_store("127.0.0.1", store.port, 2, False, timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"
    mine = [x for x in loopback.listeners() if x["port"] == store.port]
    assert mine and not loopback.exposed(mine), mine


def test_patched_tcp_rendezvous_binds_the_given_address():
    import importlib

    rdzv = importlib.import_module("torch.distributed.rendezvous")
    assert loopback.patch_tcp_rendezvous() and loopback.patch_tcp_rendezvous()  # idempotent
    port = loopback.listen("127.0.0.1").getsockname()[1]  # a free port (closed again when collected)
    store, rank, world = next(rdzv.rendezvous(f"tcp://127.0.0.1:{port}?rank=0&world_size=1",
                                              timeout=timedelta(seconds=10)))
    mine = [x for x in loopback.listeners() if x["port"] == port]
    assert mine and not loopback.exposed(mine), mine


def test_exposed_names_the_wildcard_and_routable_addresses():
    found = [{"host": h, "port": 1, "pid": 1, "process": "p"}
             for h in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::", "192.0.2.2")]
    assert [x["host"] for x in loopback.exposed(found)] == ["0.0.0.0", "::", "192.0.2.2"]


def test_a_plain_wildcard_socket_is_reported_as_exposed():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen(1)
    try:
        port = s.getsockname()[1]
        assert [x["port"] for x in loopback.exposed(loopback.listeners())].count(port) == 1
    finally:
        s.close()


def test_listen_refuses_a_taken_port():
    s = loopback.listen("127.0.0.1")
    with pytest.raises(OSError):
        loopback.listen("127.0.0.1", s.getsockname()[1])
    s.close()


def test_a_local_start_never_attaches_to_a_stale_ray_start_cluster(monkeypatch):
    """Without RAY_ADDRESS, `ray.init()` attaches to the cluster named in /tmp/ray/ray_current_cluster; after a
    killed `labkit.cluster.local` that one is dead, and every later run failed ("When connecting to an existing
    cluster, num_cpus ... must not be provided"). labkit's local start asks Ray for a new local instance."""
    import ray

    from labkit.cluster import runtime

    seen = {}

    class Started(Exception):
        pass

    def fake_init(**kw):
        seen.update(kw)
        raise Started

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # the real one would stop the session's own Ray (CI runs
    # the unit tests in the same process after the integration tests, whose engine fixture outlives them)
    monkeypatch.setattr(runtime, "local_security", lambda: {})
    monkeypatch.setattr(runtime, "local_daemons", lambda: None)
    try:
        runtime.init()
    except (Started, RuntimeError):
        pass
    assert seen.get("address") == "local" and seen.get("_node_ip_address") == "127.0.0.1", seen


def test_a_local_cluster_collects_no_metrics_or_task_events_and_bounds_the_log_monitor_and_grpc_pool_unless_asked(
        monkeypatch):
    from labkit.cluster import runtime

    reread = []
    monkeypatch.setattr(runtime, "reread_ray_config", lambda: reread.append(""))
    for k in runtime.LOCAL_DAEMONS:
        monkeypatch.delenv(k, raising=False)
    runtime.local_daemons()
    assert os.environ["RAY_enable_metrics_collection"] == "0" and reread == [""]
    assert os.environ["RAY_task_events_report_interval_ms"] == "0"
    assert os.environ["RAY_LOG_MONITOR_MAX_OPEN_FILES"] == "32"
    assert os.environ["RAY_num_grpc_internal_threads"] == "4"
    monkeypatch.setenv("RAY_enable_metrics_collection", "1")
    monkeypatch.setenv("RAY_task_events_report_interval_ms", "1000")
    runtime.local_daemons()
    assert os.environ["RAY_enable_metrics_collection"] == "1" and reread == [""]  # all set: nothing re-read
    assert os.environ["RAY_task_events_report_interval_ms"] == "1000"
