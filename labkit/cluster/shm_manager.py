"""One torch_shm_manager for a run, so that a process taking CPU tensors by shared-memory name holds one socket for
it, not one for every process that ever sent it one.

Where it bites: on a CPU box a tensor a trainer hands an engine (the per-tensor transport's
`update_weights_from_tensor`, a ring sync's placeholder) crosses as a torch `file_system` handle: a shared-memory
file plus the creator's torch_shm_manager. The receiver registers the file with that manager, and libshm keeps
the socket to it for the rest of the receiving process's life (`torch/lib/libshm/core.cpp`, its `managers` map,
never pruned). Each trainer process started a manager of its own, so every trainer restart left one more socket in
every engine's scheduler (`labkit soak`, data/soak_cpu.json at 3e7a957: the HTTP engine's scheduler +1 descriptor
after each of 11 trainer restarts). And Ray kills a dead trainer's manager with it, after which freeing one of its
segments aborts the engine (`Broken pipe`): labkit.engine.inside.apply kept such a buffer for good instead, one
bucket per killed trainer.

Here the driver starts one manager (`start`, called by labkit.cluster.runtime.init before Ray starts, so a local
cluster's workers inherit its name) and each trainer rank joins it before it shares anything (`join`): libshm files
every segment a process creates under the first manager it knows, and this one lives as long as the driver.
A process on another host, or one that had a manager of its own already, keeps torch's behaviour (`join` says so).
"""

from __future__ import annotations

import os
import socket

ENV = "LABKIT_SHM_MANAGER"  # "<manager socket path>|<a segment filed under it>|<its bytes>"
_held: list = []  # the segment that names the manager: held, so the manager always has a client here


def start() -> str:
    """This process's torch_shm_manager (started now if it has none), named in the environment for the processes
    started from here. Idempotent; a name already in the environment (a parent's) is kept."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    import torch

    storage = torch.UntypedStorage(8)
    handle, name, size = storage._share_filename_cpu_()
    _held.append(storage)
    os.environ[ENV] = f"{handle.decode()}|{name.decode()}|{size}"
    return os.environ[ENV]


def join() -> bool:
    """File every segment this process will create under the run's manager. Call before this process shares a
    tensor. Returns whether it now does (False: no run manager named, one on another host, or this process had a
    manager of its own before: torch then keeps choosing among them)."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    handle, name, size = spec.rsplit("|", 2)
    if not alive(handle):
        return False
    import torch

    try:
        _held.append(torch.UntypedStorage._new_shared_filename_cpu(handle.encode(), name.encode(), int(size)))
    except RuntimeError:  # the naming segment is gone (its driver exited)
        return False
    return manager_of(torch.UntypedStorage(1)) == handle


def manager_of(storage) -> str:
    """The manager a CPU storage is (now) filed under; a storage not yet shared is moved into shared memory."""
    return storage._share_filename_cpu_()[0].decode()


def alive(handle: str | bytes) -> bool:
    """Whether a torch_shm_manager accepts at `handle` (its socket path). A manager killed with SIGKILL leaves its
    socket file behind, so the path existing says nothing; a connection that is accepted and closed unused is what
    the manager sees of any client that exits before registering a segment."""
    path = handle.decode() if isinstance(handle, bytes) else handle
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
