"""The trainer joins the engine's weight-update group and broadcasts each flat buffer into it.

The rendezvous port is bound by the trainer *before* the engine is told about it, so a port taken by someone else is a
retry with another port, never an engine connecting to a stranger (or waiting for a store that will never come up). The
group (rendezvous, store, every broadcast) carries `timeout_s`, and so does every engine call made here.
"""

from __future__ import annotations

import errno
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world

from labkit import failpoints as fp
from labkit.cluster import runtime
from labkit.compat import loopback
from labkit.engine.config import APPLY_FORMAT
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket

PORT_ATTEMPTS = 5


def bind_store(host: str, world_size: int, timeout_s: float, attempts: int = PORT_ATTEMPTS):
    """The rendezvous TCPStore, hosted here (rank 0) on a free port of `host` only; (store, port, retries)."""
    errors = []
    for i in range(attempts):
        port = runtime.free_port()
        fp.hit("transport.open", host=host, port=port)
        try:
            sock = loopback.listen(host, port)
        except OSError as e:  # free_port() is a guess: another process may bind it first
            if e.errno != errno.EADDRINUSE:
                raise
            errors.append(port)
            continue
        store = loopback.tcp_store(host, port, world_size, True, timedelta(seconds=timeout_s), sock=sock)
        return store, port, i
    raise RuntimeError(f"could not bind a rendezvous port for the weight-update group: ports {errors} were "
                       f"all in use ({attempts} attempts)")


def join_group(store, world_size: int, group_name: str, backend: str, timeout_s: float = 120.0):
    """Rank 0 of SGLang's weight-update group, built the way `init_custom_process_group` builds it
    (PrefixStore named after the group over the rendezvous store)."""
    timeout = timedelta(seconds=timeout_s)
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(world_size, 0, [], torch.distributed.Backend(backend),
                                      PrefixStore(group_name, store), group_name=group_name, backend_options=None,
                                      timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def broadcast(transport: Distributed, flat: torch.Tensor) -> None:
    """One bucket from rank 0 into the group; a failure releases the group before it is raised.

    The failure the release prevents: several engines share one group; one dies mid-broadcast, the trainer's
    broadcast fails, and the engines still alive wait in their receive. They wait until the trainer's group is
    freed (`Distributed.release`), and the failed broadcast's error pins it: its traceback holds the frames
    whose locals are the group and its work. So the error is read inside the except block, whose end frees it,
    and raised again as a new RuntimeError after the release. Unreleased, a live engine stayed blocked for
    minutes (the soak's sync 233: until a garbage collection broke the traceback's cycle), was fenced as dead, and
    its clients' requests timed out."""
    try:
        torch.distributed.broadcast(flat, src=0, group=transport.pg)
        return
    except RuntimeError as e:
        error = f"{type(e).__name__}: {e}"
    transport.release()
    raise RuntimeError(f"broadcast into the weight-update group failed: {error}")


class Distributed:
    """transport="distributed": SGLang's `update_weights_from_distributed(load_format="flattened_bucket")`.

    Flow:
    1. open: bind the rendezvous store on this node (`bind_store`, retried on a taken port), then at once
       `engine.init_weights_update_group(addr, port, rank_offset=1, world)` on a worker thread and
       `join_group` here (rank 0; the engine's TP ranks are 1..tp): each side blocks until the other joins;
    2. send, per bucket: `engine.update_weights_from_distributed(names, dtypes, shapes)` on the worker
       thread (the engine starts receiving) while this thread broadcasts the flat buffer (gloo on CPU, NCCL
       on GPU); returns when the engine answers that it loaded the bucket;
    3. close: `engine.destroy_weights_update_group`, then destroy the process group here (also on failure).

    Into labkit's copy plan (unless SyncConfig.engine_loader="sglang"): where the engine's model routes labkit payloads
    (`engine.routes_flat()`: labkit's models on a CPU engine), the bucket is announced as one uint8 tensor named by its
    layout (with `delta`, the delta payload: labkit.sync.delta); SGLang receives it whole and hands it to the model's
    `load_weights`, which passes it to labkit.engine.inside.apply (no per-tensor loop)."""

    name = "distributed"
    flattened = True
    same_node = False

    def __init__(self, group_name: str = "labkit_weight_update", timeout_s: float = 120.0, delta=None,
                 engine_loader: str = "auto"):
        self.group_name, self.timeout_s, self.delta, self.engine_loader = group_name, timeout_s, delta, engine_loader
        self.pg, self.port_retries, self.flat, self.apply_path = None, 0, False, "load_weights"
        self.landed = True  # every send so far returned: the engine is not stuck in a receive
        self.released = False  # this side of the group is gone (`release`)
        self.joined = False  # the group was built and `close` has not run: the engines must be told to drop it
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="labkit-engine")

    @property
    def packs_into_stage(self) -> bool:
        """A gloo broadcast sends from any host buffer: under the atomic guard the syncer packs each bucket into
        the guard's staging copy and it is broadcast from there (the rollback copy costs no copy of its own)."""
        return self.delta is None and not torch.cuda.is_available()

    def open(self, engine, plan) -> None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.flat = (self.engine_loader != "sglang" and not torch.cuda.is_available() and engine.accepts(APPLY_FORMAT)
                     and engine.routes_flat())
        if self.delta is not None and not self.flat:
            raise ValueError("delta sync needs labkit's engine-side loader (labkit.engine.inside.apply) behind the "
                             "engine model's load_weights (labkit's models on a CPU engine): sync with "
                             "SyncConfig.delta=0")
        addr, world = runtime.node_ip(), 1 + engine.tp_size
        store, port, self.port_retries = bind_store(addr, world, self.timeout_s)
        # Both sides build the group at once: the engine call blocks until the trainer joins.
        fut = None if fp.hit("transport.peer") else self._pool.submit(
            engine.init_weights_update_group, master_address=addr, master_port=port, rank_offset=1,
            world_size=world, group_name=self.group_name, backend=backend)
        self.pg = join_group(store, world, self.group_name, backend, self.timeout_s)
        self.joined = True
        fut.result(timeout=self.timeout_s)

    def send(self, engine, b: Bucket, tensors=None, flat: torch.Tensor | None = None) -> dict:
        t0, encode, self.landed = time.perf_counter(), 0.0, False
        if self.flat:
            key = bk.layout_key(b)
            if self.delta is not None:
                flat, key = self.delta.encode(b, flat, key)
                encode, t0 = time.perf_counter() - t0, time.perf_counter()
            names, dtypes, shapes = [key], ["uint8"], [[flat.numel()]]
        else:
            names, dtypes, shapes = b.names, [t.dtype for t in b.tensors], [list(t.shape) for t in b.tensors]
        fut = self._pool.submit(engine.update_weights_from_distributed, names=names, dtypes=dtypes, shapes=shapes,
                                group_name=self.group_name, load_format="flattened_bucket", flush_cache=False)
        fp.hit("transport.send", flat=flat)
        broadcast(self, flat)
        t1 = time.perf_counter()
        fut.result(timeout=self.timeout_s)
        self.landed = True
        return {"encode": encode, "transfer": t1 - t0, "load": time.perf_counter() - t1}

    def close(self, engine) -> None:
        if not self.joined:  # never built, or closed already (a failed broadcast released it: still closed here)
            return
        try:
            # Read before the group goes (a failing read must not leave it behind); not after a send that did not
            # return, where the engine may sit in a receive and the read would wait out another call timeout.
            if self.flat and self.landed:
                self.apply_path = engine.apply_path()
            elif not self.landed:  # engines may still wait in the receive: let them go before calling them
                self.release()
        finally:
            try:
                engine.destroy_weights_update_group(self.group_name)
            finally:
                self.release()
                self.joined = False
                self._pool.shutdown(wait=False)

    def release(self) -> None:
        """This side of the group, gone: its connections close, and an engine's receive fails at once.

        gloo closes a group's connections only when the group object is freed (abort() and shutdown() leave
        them open), and nothing else ends a peer's receive before the group's timeout. `broadcast` is why a
        failed broadcast's error holds no reference to the group."""
        if self.pg is not None:
            pg, self.pg, self.released = self.pg, None, True
            torch.distributed.destroy_process_group(pg)
