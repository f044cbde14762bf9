"""Ray start/attach. Local Ray on loopback by default; any cluster through RAY_ADDRESS (or `address=`)."""

from __future__ import annotations

import os
import socket

START_ATTEMPTS = 3


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(address: str | None = None, num_cpus: int | None = None) -> dict:
    """Start local Ray (loopback only) or attach to `address` / $RAY_ADDRESS. Idempotent."""
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            ray.init(address=address, logging_level="WARNING")
        else:
            # A local single-user cluster: no token file in $HOME, no dashboard, loopback only.
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            os.environ.setdefault("RAY_DEDUP_LOGS", "1")
            # Logical CPUs: trainer ranks and engines are mostly idle between calls; 2 physical cores must
            # still host a TP=2 trainer and an engine side by side.
            kw = dict(num_cpus=num_cpus or max(8, os.cpu_count() or 1), include_dashboard=False,
                      _node_ip_address="127.0.0.1", logging_level="WARNING", log_to_driver=True)
            for attempt in range(START_ATTEMPTS):
                try:
                    ray.init(**kw)
                    break
                except Exception as e:  # a loaded 2-core box misses Ray's fixed 30 s raylet deadline at times
                    ray.shutdown()
                    if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS - 1:
                        raise RuntimeError(f"local Ray did not start ({START_ATTEMPTS} attempts; the machine may "
                                           f"be overloaded): {e}") from e
    res = ray.cluster_resources()
    return {"address": ray.get_runtime_context().gcs_address, "cpus": res.get("CPU", 0), "gpus": res.get("GPU", 0)}


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
