"""What a long run holds, sampled between syncs: every process of the run (resident memory, open file descriptors,
threads), the files under /dev/shm, and Ray's object store.

A leak shows as one of these growing sync after sync, or not coming back to its level after a sync: a mapped
bucket never unmapped, a staging file never unlinked (SGLang's `sglang_loads_*`, labkit's last good copies), an
object ref held in a list. Processes are found from their roots (the driver; the pids of Ray actors and engine
servers) with all their children, and named by role from the titles SGLang and Ray give them, so a series can
follow a role across a restart (a fault that kills an engine brings a new pid, not a new role).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import psutil

# (title prefix, role): the first match names the process; SGLang and Ray set these titles (setproctitle)
ROLES = (("sglang::scheduler", "scheduler"), ("sglang::detokenizer", "detokenizer"),
         ("ray::EngineActor", "engine actor"), ("ray::TrainerRank", "trainer rank"))
SHM = Path("/dev/shm")


def role(proc: psutil.Process) -> str:
    """The process's role from its title; `driver` for this process, otherwise its executable's name."""
    if proc.pid == os.getpid():
        return "driver"
    try:
        return role_of(proc.cmdline(), proc.name())
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.AccessDenied:
        return "unreadable"


def role_of(cmdline: list[str], name: str) -> str:
    """The role a command line (and executable name) shows. Ray's Python daemons (log monitor, dashboard, monitor)
    are named by their script; a native one by its executable (the raylet's command line names Python scripts
    it starts, setup_worker.py among them: it is not one)."""
    title = " ".join(cmdline) or name
    if "sglang.launch_server" in title:  # labkit's HTTP engine: `python -m sglang.launch_server ...`
        return "http server"
    if cmdline and "python" in Path(cmdline[0]).name and "/ray/" in title and ".py" in title:
        script = next(w for w in cmdline if w.endswith(".py"))
        return "ray " + script.rsplit("/", 1)[-1][:-3]
    known = next((r for prefix, r in ROLES if title.startswith(prefix)), None)
    if known is None and title.startswith("ray::"):  # Ray's own workers and agents: ray::IDLE, ray::DashboardAgent
        return "ray " + re.split(r"[.\s(]", title[5:], maxsplit=1)[0]
    return known or name


def store_pages(pid: int | str = "self") -> int:
    """Resident bytes of the process's mappings of Ray's object store (the plasma arena, one file mapped by every
    Ray worker and the raylet: `plasma*` under /dev/shm or Ray's plasma directory). A page of the arena that the
    process reads once stays in its RSS for good, shared, while the store reuses it for object after object, so
    each object that lands where the process never read before adds to it (the soak's driver: its shared pages
    were +1.9 of its +2.57 MB per 100 syncs in data/soak_cpu.json at bcf5e06). Bounded by the store's size; what
    the store holds is read apart (`object_store`). /proc/<pid>/maps is read first: smaps, which sizes every
    mapping, only where the arena is mapped."""
    try:
        if b"/plasma" not in Path(f"/proc/{pid}/maps").read_bytes():
            return 0
        lines, total, inside = Path(f"/proc/{pid}/smaps").read_bytes().splitlines(), 0, False
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    for line in lines:
        head = line.split(maxsplit=6)
        if len(head) >= 5 and b"-" in head[0] and not head[0].endswith(b":"):  # a mapping's header line
            inside = len(head) >= 6 and Path(head[5].decode(errors="replace")).name.startswith("plasma")
        elif inside and head[0] == b"Rss:":
            total += int(head[1]) * 1024
    return total


class StorePages:
    """`store_pages` per pid, read again only when the process's shared resident pages changed (the store's pages
    are among them). Reading smaps costs ~20 ms for a process with torch loaded: for every process that maps the
    store, after every sync, it took a 20-minute soak's sampling to 73 s (data/soak_store_pages_cpu.json, 293 syncs;
    data/soak_cpu.json at bcf5e06: 23 s, 329 syncs)."""

    def __init__(self):
        self._last: dict[int, tuple[int, int]] = {}  # pid -> (shared bytes when read, store pages then)

    def __call__(self, pid: int, shared_bytes: int) -> int:
        last = self._last.get(pid)
        if last is None or last[0] != shared_bytes:
            last = self._last[pid] = (shared_bytes, store_pages(pid))
        return last[1]

    def keep(self, pids: set[int]) -> None:
        """Forget the processes not in `pids` (gone: a pid may come back as another process)."""
        for pid in set(self._last) - pids:
            del self._last[pid]


_STORE_PAGES = StorePages()


def processes(roots: Iterable[int], store: StorePages = _STORE_PAGES) -> list[dict]:
    """Every live process under `roots` (each root and its descendants, once): pid, role, resident bytes (and of
    them the shared ones: file-backed pages, /dev/shm mappings included; and the pages of Ray's object store it
    maps, `store_pages`), open file descriptors and threads. A process that exits while it is read is left out,
    not counted as zero."""
    seen: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            continue
    out = []
    for pid, p in sorted(seen.items()):
        try:
            with p.oneshot():
                mem = p.memory_info()
                out.append({"pid": pid, "role": role(p), "rss_bytes": mem.rss, "shared_bytes": mem.shared,
                            "store_pages_bytes": store(pid, mem.shared), "fds": p.num_fds(),
                            "threads": p.num_threads()})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    store.keep(set(seen))
    return out


def shm(root: Path = SHM) -> dict:
    """Files under /dev/shm and their bytes (anyone's: a leak of SGLang's, Ray's or torch's counts as well)."""
    files = [p for p in root.iterdir() if p.is_file()] if root.is_dir() else []
    total = 0
    for p in files:
        try:
            total += p.stat().st_size
        except FileNotFoundError:  # unlinked while listed
            continue
    return {"files": len(files), "bytes": total}


class StoreReader:
    """Ray's object store across the cluster (bytes in use, objects), from the raylet's memory report (ray 2.60's
    own `ray memory --stats-only` request), over one gRPC channel to the raylet kept for as long as its address
    holds. Ray's `internal_api.get_memory_info_reply` opens a new channel per call and leaves it to the garbage
    collector: every reading was a new connection to the raylet, and grpcio's event-engine pool in the driver
    shrank and regrew around each (the soak's driver threads: `native:event_engine` came and went all run, and two
    stayed from sync 299, data/soak_cpu.json at 0571901). Kept, the pool holds one size and the raylet serves one
    connection (data/soak_store_reader_cpu.json, scripts/store_reader_ab.py)."""

    def __init__(self):
        self._address: str | None = None
        self._channel = self._stub = None

    def __call__(self) -> dict | None:
        """None when this process is not connected to Ray."""
        import ray

        if not ray.is_initialized():
            self.close()
            return None
        from ray._private import state
        from ray.core.generated import node_manager_pb2

        raylet = next(n for n in state.state.node_table() if n["Alive"])  # any raylet answers for the cluster
        address = f"{raylet['NodeManagerAddress']}:{raylet['NodeManagerPort']}"
        if address != self._address:  # a new Ray session, or that raylet gone: a channel to the one alive now
            self._open(address)
        stats = self._stub.FormatGlobalMemoryInfo(
            node_manager_pb2.FormatGlobalMemoryInfoRequest(include_memory_info=False), timeout=60.0).store_stats
        return {"bytes": int(stats.object_store_bytes_used), "objects": int(stats.num_local_objects)}

    def _open(self, address: str) -> None:
        import ray
        from ray._private.grpc_utils import init_grpc_channel  # Ray's channel: its TLS, token auth and keepalive
        from ray.core.generated import node_manager_pb2_grpc

        self.close()
        size = ray._config.max_grpc_message_size()
        self._channel = init_grpc_channel(address, options=[("grpc.max_send_message_length", size),
                                                            ("grpc.max_receive_message_length", size)])
        self._stub, self._address = node_manager_pb2_grpc.NodeManagerServiceStub(self._channel), address

    def opened(self) -> str | None:
        """The raylet address its channel is open to (None: none open)."""
        return self._address

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._address = self._channel = self._stub = None


object_store = StoreReader()


def settled_object_store(waits_s: tuple[float, ...] = (0.25, 0.5, 1.0)) -> dict | None:
    """`object_store`, read again after each of `waits_s` while it holds anything. Ray deletes an object after its
    last reference is gone, asynchronously (the owner's reference count, then the raylet's delete), so a reading
    right after a sync can still show that sync's last argument (a per-tensor bucket for the actor engine, 0.4 to
    1.8 MB in the soaks): in flight, not kept. An object still there after the waits is held."""
    store = object_store()
    for w in waits_s:
        if store is None or store["bytes"] == 0:
            break
        time.sleep(w)
        store = object_store()
    return store


def thread_names() -> Counter:
    """This process's threads, counted by name: Python's name for a thread Python started (a pool's index as #),
    the kernel's (`native:<comm>`) for the others (Ray's and gRPC's, OpenMP's). A thread that appears and stays
    is then named, not only counted (the soak's driver: 33 to 35 threads at two syncs in data/soak_cpu.json at
    c03cb0d, next to a 7.37 MB step in its private memory)."""
    import threading

    python = {t.native_id: re.sub(r"\d+", "#", t.name) for t in threading.enumerate()}
    out: Counter = Counter()
    for task in Path("/proc/self/task").iterdir():
        try:
            out[python.get(int(task.name)) or "native:" + (task / "comm").read_text().strip()] += 1
        except (OSError, ValueError):  # a thread that ended while it was read
            continue
    return out


def sample(roots: Iterable[int]) -> dict:
    """One reading of everything above."""
    return {"processes": processes(roots), "shm": shm(), "object_store": settled_object_store()}


def compact(sample: dict) -> dict:
    """A resource sample in the few numbers the summary reads (a soak keeps one per sync)."""
    store = sample["object_store"] or {}
    return {"procs": {p["pid"]: [p["role"], p["rss_bytes"], p["fds"], p["threads"], p["shared_bytes"],
                                 p["store_pages_bytes"]]
                      for p in sample["processes"]},
            "shm_files": sample["shm"]["files"], "shm_bytes": sample["shm"]["bytes"],
            "store_bytes": store.get("bytes")}


def thread_change(before: Counter, now: Counter) -> dict:
    """The threads (by `thread_names`) that came and went between two readings."""
    return {"added": sorted((now - before).elements()), "gone": sorted((before - now).elements())}
