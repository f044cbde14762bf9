"""Ray start/attach. Local Ray on loopback, with token auth, by default; any cluster through RAY_ADDRESS.

A local run holds Ray (GCS, raylet, agents, workers) to 127.0.0.1 (labkit.compat.loopback says how and why)
and turns on Ray's token authentication with a fresh random token that lives only in this process's
environment (children inherit it; nothing is written to $HOME). An explicit `RAY_AUTH_MODE` wins; `disabled`
is honoured but warned about. Attaching to a cluster (`RAY_ADDRESS`) leaves its addresses and auth to it.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket

from labkit.cluster import allocator, shm_manager
from labkit.compat import loopback, quiet

START_ATTEMPTS = 3
log = logging.getLogger(__name__)
# Options of every labkit actor (trainer ranks, engine actors). Task events off: by default Ray records every actor
# call in the GCS for the dashboard's task table and keeps up to 100,000 (`task_events_max_num_task_in_gcs`), so
# the GCS's memory grew sync after sync (one sync is dozens of actor calls; `labkit soak` judges the GCS's slope
# like every other process's). labkit reads no task state.
ACTOR_OPTIONS = {"enable_task_events": False}


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def here() -> dict:
    """This process's node as Ray reports it: {"node_id": hex or None outside Ray, "node_ip"}."""
    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return {"node_id": node_id, "node_ip": node_ip()}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(address: str | None = None, num_cpus: int | None = None) -> dict:
    """Start local Ray (loopback only) or attach to `address` / $RAY_ADDRESS. Idempotent."""
    import ray

    if not ray.is_initialized():
        quiet.install()  # before Ray starts: a local cluster's workers inherit this environment
        allocator.install()  # likewise: freed memory goes back to the system (labkit.cluster.allocator)
        shm_manager.start()  # likewise: one torch_shm_manager for every trainer process (labkit.cluster.shm_manager)
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            if loopback.is_loopback(address.rsplit(":", 1)[0]):
                # A cluster of several nodes on this host (labkit.cluster.local): its nodes live on 127.0.0.1, and
                # a driver not held to loopback rewrites that to the routable address and never reaches the GCS.
                loopback.hold_ray_to_loopback()
            ray.init(address=address, logging_level="WARNING")
        else:
            # A local single-user cluster: loopback only, token auth, no token file in $HOME, no dashboard.
            local_daemons()
            local_security()
            os.environ.setdefault("RAY_DEDUP_LOGS", "1")
            # Logical CPUs: trainer ranks and engines are mostly idle between calls; 2 physical cores must
            # still host a TP=2 trainer and an engine side by side.
            # address="local": without it Ray attaches to the last `ray start` cluster named in
            # /tmp/ray/ray_current_cluster, and when that one was killed (a crashed `labkit.cluster.local`) every
            # later run failed ("When connecting to an existing cluster, num_cpus ... must not be provided").
            kw = dict(address="local", num_cpus=num_cpus or max(8, os.cpu_count() or 1), include_dashboard=False,
                      _node_ip_address="127.0.0.1", logging_level="WARNING", log_to_driver=True)
            for attempt in range(START_ATTEMPTS):
                try:
                    ray.init(**kw)
                    break
                except Exception as e:  # a loaded small CPU host misses Ray's fixed 30 s raylet deadline at times
                    ray.shutdown()
                    if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS - 1:
                        raise RuntimeError(f"local Ray did not start ({START_ATTEMPTS} attempts; the machine may "
                                           f"be overloaded): {e}") from e
    res = ray.cluster_resources()
    return {"address": ray.get_runtime_context().gcs_address, "cpus": res.get("CPU", 0), "gpus": res.get("GPU", 0),
            "auth": os.environ.get("RAY_AUTH_MODE", "")}


def reread_ray_config() -> None:
    """Ray's C++ config reads the environment once; a driver that imported Ray already must re-read it after a
    change, as Ray's own `_enable_token_auth` does (a token-mode GCS, else, is talked to without the token)."""
    from ray._raylet import Config

    Config.initialize("")


# Ray settings of a local cluster, each unless the user set it (a cluster reached through RAY_ADDRESS keeps its own).
LOCAL_DAEMONS = {
    # Metrics: a local cluster runs no dashboard and no Prometheus, so nothing reads them; collecting them grew
    # Ray's dashboard agent with run time (`labkit soak`, data/soak_cpu.json at 114c90d: the agent's slope).
    "RAY_enable_metrics_collection": "0",
    # Task events: no worker reports any. labkit's actors are created with them off (ACTOR_OPTIONS), yet a trainer's
    # calls into an engine actor during per-tensor syncs were recorded in the GCS, ~3.3 KB each up to Ray's cap of
    # 100,000 (a soak's GCS log: 0 -> 995 stored in 7 minutes, its memory +4 MB).
    "RAY_task_events_report_interval_ms": "0",
    # Ray's log monitor keeps the .out and .err of every worker that ever printed open until it holds this many
    # files (default 200), then closes them all: two descriptors per restarted actor, ~100 restarts deep. A bound
    # this small is reached within a soak, so its descriptors are seen to come back.
    "RAY_LOG_MONITOR_MAX_OPEN_FILES": "32",
    # gRPC's event-engine pool in the GCS and the raylet: it starts at 2-3 threads, adds two when calls pile up and
    # keeps them (a thread exits only after 30 s idle, which a busy daemon never is), so a long run shows a level
    # that steps up once at a random sync. Started at 4 it begins where a burst takes it and stays there
    # (data/soak_grpc_threads4_cpu.json: GCS 28 and raylet 31 threads from the first sync to the last).
    "RAY_num_grpc_internal_threads": "4",
}


def local_daemons() -> None:
    """LOCAL_DAEMONS in the environment before a local Ray starts, each unless the user set it."""
    changed = False
    for k, v in LOCAL_DAEMONS.items():
        if os.environ.get(k) is None:
            os.environ[k] = v
            changed = True
    if changed:
        reread_ray_config()


def local_security() -> dict:
    """Loopback and token auth for a local cluster, set in the environment before Ray starts."""
    loopback.hold_ray_to_loopback()
    if os.environ.get("RAY_AUTH_MODE") is None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        reread_ray_config()
    elif os.environ["RAY_AUTH_MODE"].lower() == "disabled":
        log.warning("RAY_AUTH_MODE=disabled: this local Ray cluster accepts work from any process that reaches "
                    "127.0.0.1 without a token")
    return {"auth": os.environ["RAY_AUTH_MODE"], "node_ip": "127.0.0.1"}


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def wait_dead(actors, timeout_s: float = 30.0) -> None:
    """Until no actor answers (bounded): what a killed actor held (files, ports) is free only once its process is
    gone."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    pending = list(actors)
    while pending and time.monotonic() < deadline:
        alive = []
        for a in pending:
            try:
                ray.get(a.__ray_ready__.remote(), timeout=1)
                alive.append(a)
            except ray.exceptions.GetTimeoutError:
                alive.append(a)  # still going down
            except ray.exceptions.RayError:
                pass
        pending = alive
        if pending:
            time.sleep(0.2)
