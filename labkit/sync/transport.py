"""How a packed bucket reaches the engine. One interface, three transports.

- `per-tensor`: one `update_weights_from_tensor` call per tensor (what verl did before PR #2418): the baseline.
- `colocated`: the flat buffer stays where it is (shared memory on CPU, device memory on GPU) and only a
  serialized handle crosses to the engine -> `update_weights_from_tensor(load_format="flattened_bucket")`.
- `distributed`: the trainer joins the engine's weight-update group exactly as SGLang builds it (TCP
  rendezvous, then a PrefixStore named after the group) and broadcasts each flat buffer (gloo on CPU, NCCL
  on GPU) while the engine receives it in `update_weights_from_distributed(load_format="flattened_bucket")`.

`send()` returns only when the engine has loaded the bucket; the session overlaps packing the next
bucket with it by running `send()` on a worker thread.

No wait is unbounded: the distributed group (rendezvous, store, every broadcast) carries `timeout_s`, and so
does every engine call made here. The rendezvous port is bound by the trainer *before* the engine is told
about it, so a port taken by someone else is a retry with another port, never an engine connecting to a
stranger (or waiting for a store that will never come up).
"""

from __future__ import annotations

import errno
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch

from labkit.compat import loopback
from labkit.sync import bucket as bk
from labkit import failpoints as fp
from labkit.sync.config import TRANSPORTS
from labkit.sync.plan import Bucket



class PerTensor:
    name = "per-tensor"
    flattened = False

    def open(self, engine, plan) -> None:
        pass

    def send(self, engine, b: Bucket, tensors: dict[str, torch.Tensor], flat=None) -> dict:
        t0 = time.perf_counter()
        for meta in b.tensors:
            # A copy, always: handing a CPU tensor to an engine moves its storage into shared memory in place
            # (torch's file_system sharing), which would race with the syncer hashing the same export tensor
            # (a wrong expected checksum, seen under load) and put the trainer's own storage into /dev/shm.
            t = tensors[meta.name].detach().to("cpu", bk.torch_dtype(meta.dtype), copy=True).contiguous()
            engine.update_weights_from_tensor([(meta.name, t)], flush_cache=False)
        return {"load": time.perf_counter() - t0}

    def close(self, engine) -> None:
        pass


class Colocated:
    name = "colocated"
    flattened = True

    def open(self, engine, plan) -> None:
        self.engine_tp = engine.tp_size

    def send(self, engine, b: Bucket, tensors=None, flat: torch.Tensor | None = None) -> dict:
        from sglang.srt.utils import MultiprocessingSerializer

        t0 = time.perf_counter()
        fp.hit("transport.send", flat=flat)
        payload = MultiprocessingSerializer.serialize({"flattened_tensor": flat, "metadata": bk.metadata(b)},
                                                      output_str=True)
        t1 = time.perf_counter()
        # One payload per engine TP rank: each rank opens the same handle and reads its own shard.
        engine.update_weights_from_tensor([payload] * self.engine_tp, load_format="flattened_bucket",
                                          flush_cache=False)
        return {"transfer": t1 - t0, "load": time.perf_counter() - t1}

    def close(self, engine) -> None:
        pass


PORT_ATTEMPTS = 5


def bind_store(host: str, world_size: int, timeout_s: float, attempts: int = PORT_ATTEMPTS):
    """The rendezvous TCPStore, hosted here (rank 0) on a free port of `host` only; (store, port, retries)."""
    from labkit.cluster.runtime import free_port

    errors = []
    for i in range(attempts):
        port = free_port()
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
    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world

    timeout = timedelta(seconds=timeout_s)
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(world_size, 0, [], torch.distributed.Backend(backend),
                                      PrefixStore(group_name, store), group_name=group_name, backend_options=None,
                                      timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


class Distributed:
    name = "distributed"
    flattened = True

    def __init__(self, group_name: str = "labkit_weight_update", timeout_s: float = 120.0):
        self.group_name, self.timeout_s, self.pg = group_name, timeout_s, None
        self.port_retries = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="labkit-engine")

    def open(self, engine, plan) -> None:
        from labkit.cluster.runtime import node_ip

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        addr, world = node_ip(), 1 + engine.tp_size
        store, port, self.port_retries = bind_store(addr, world, self.timeout_s)
        # Both sides build the group at once: the engine call blocks until the trainer joins.
        fut = None if fp.hit("transport.peer") else self._pool.submit(
            engine.init_weights_update_group, master_address=addr, master_port=port, rank_offset=1,
            world_size=world, group_name=self.group_name, backend=backend)
        self.pg = join_group(store, world, self.group_name, backend, self.timeout_s)
        fut.result(timeout=self.timeout_s)

    def send(self, engine, b: Bucket, tensors=None, flat: torch.Tensor | None = None) -> dict:
        t0 = time.perf_counter()
        fut = self._pool.submit(engine.update_weights_from_distributed, names=b.names,
                                dtypes=[t.dtype for t in b.tensors], shapes=[list(t.shape) for t in b.tensors],
                                group_name=self.group_name, load_format="flattened_bucket", flush_cache=False)
        fp.hit("transport.send", flat=flat)
        torch.distributed.broadcast(flat, src=0, group=self.pg)
        t1 = time.perf_counter()
        fut.result(timeout=self.timeout_s)
        return {"transfer": t1 - t0, "load": time.perf_counter() - t1}

    def close(self, engine) -> None:
        if self.pg is not None:
            try:
                engine.destroy_weights_update_group(self.group_name)
            finally:
                torch.distributed.destroy_process_group(self.pg)
                self.pg = None
                self._pool.shutdown(wait=False)


def make(name: str, timeout_s: float = 120.0):
    if name == "per-tensor":
        return PerTensor()
    if name == "colocated":
        return Colocated()
    if name == "distributed":
        return Distributed(timeout_s=timeout_s)
    raise ValueError(f"transport={name!r} is invalid: expected one of {', '.join(TRANSPORTS)}")
