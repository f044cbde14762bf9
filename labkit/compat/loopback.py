"""Hold labkit's listeners to one address: loopback on a local run, the node's own address on a cluster.

Why: out of the box (Ray 2.60, torch 2.14, SGLang 0.5.23) a local run listened on `0.0.0.0` / `*` and on the
host's routable address: Ray's GCS, raylet, agents and worker processes, SGLang's scheduler, and every gloo
rendezvous store. With Ray's auth off, anyone who could reach the machine could submit work to that Ray
cluster (the ShadowRay class of attack on unauthenticated Ray). Three mechanisms, each closed here:

- Ray rewrites `_node_ip_address="127.0.0.1"` to the routable address on Linux (`resolve_ip_for_localhost`,
  gated by `ray_constants.ENABLE_RAY_CLUSTER`). `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps it loopback; it is
  read when `ray._private.ray_constants` is imported, so `hold_ray_to_loopback()` sets both the variable (for
  Ray's own processes) and the attribute (for a driver that imported Ray already).
- A torch `TCPStore` master listens on the wildcard whatever host it is given. `tcp_store()` binds the socket
  itself and hands it over (`master_listen_fd`); `patch_tcp_rendezvous()` does the same for stores that torch
  creates from a `tcp://host:port` init method (SGLang's scheduler builds its TP group that way).
- gloo picks an interface from the hostname; `GLOO_SOCKET_IFNAME=lo` keeps a local run's pairs on loopback.

Auth is the second line: a local cluster runs with Ray's token authentication (a fresh random token per
run, in the environment only, never `RAY_AUTH_MODE=disabled` by default); see labkit.cluster.runtime.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import socket
from datetime import timedelta

# What a local run puts into its environment before Ray starts (children inherit it).
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "GLOO_SOCKET_IFNAME": "lo"}


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    return host == "localhost" or (is_ip(host) and ipaddress.ip_address(host).is_loopback)


def hold_ray_to_loopback() -> None:
    """Before a local `ray.init`: keep Ray's node address (and so its servers) on 127.0.0.1."""
    for k, v in LOCAL_ENV.items():
        os.environ.setdefault(k, v)
    try:
        from ray._private import ray_constants
    except ImportError:
        return
    ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] not in ("0", "false", "False")


def listen(host: str, port: int = 0, backlog: int = 512) -> socket.socket:
    """A listening TCP socket on exactly `host` (an IP literal), never the wildcard."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        s.listen(backlog)
    except BaseException:
        s.close()
        raise
    return s


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout: timedelta, *,
              sock: socket.socket | None = None, wait_for_workers: bool = False, multi_tenant: bool = False):
    """A torch TCPStore whose master listens on `host` only (`sock`: a socket already bound there)."""
    from torch.distributed import TCPStore

    if not is_master:
        return TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    if sock is None:
        sock = listen(host, port)
    port = sock.getsockname()[1]
    # The store owns the descriptor from here on (detach: the Python object must not close it when collected).
    return TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=wait_for_workers,
                    multi_tenant=multi_tenant, master_listen_fd=sock.detach())


def patch_tcp_rendezvous() -> bool:
    """Make the master of every `tcp://IP:port` rendezvous in this process bind that IP, not the wildcard.

    torch's `_tcp_rendezvous_handler` calls the module-level `_create_c10d_store`; the wrapper hands it a socket
    bound to the given address. Hostnames (not IP literals) and torchelastic's agent store are left to torch.
    Idempotent; returns True once applied.
    """
    # (`torch.distributed.rendezvous` the attribute is a function; the module is what the handler reads)
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    original = rdzv._create_c10d_store
    if getattr(original, "labkit_loopback", False):
        return True

    def create(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or not is_ip(hostname) or rdzv._agent_store_serves(hostname, port):
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        return tcp_store(hostname, port, world_size, True, timeout, multi_tenant=True)

    create.labkit_loopback = True
    rdzv._create_c10d_store = create
    return True


def listeners(root_pid: int | None = None) -> list[dict]:
    """Listening TCP sockets of `root_pid` (default: this process) and all its descendants: on a local run that
    is labkit's whole footprint (Ray's GCS, raylet, agents and workers; SGLang's processes; rendezvous stores)."""
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
    out = []
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in procs:
            try:
                name = procs[c.pid].name()
            except psutil.NoSuchProcess:
                name = "?"
            out.append({"host": c.laddr.ip, "port": c.laddr.port, "pid": c.pid, "process": name})
    return out


def exposed(found: list[dict]) -> list[dict]:
    """The listeners not held to loopback (the wildcard, or any routable address)."""
    def local(host: str) -> bool:
        ip = ipaddress.ip_address(host.split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip
        return ip.is_loopback

    return [x for x in found if not local(x["host"])]
