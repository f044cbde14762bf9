"""How a packed bucket reaches the engine. One interface (`Transport`), four transports, one file each
under labkit/sync/transports/:

- `per-tensor` (`PerTensor`), the baseline: one `update_weights_from_tensor` call per tensor (verl before PR #2418).
- `colocated` (`Colocated`): the flat buffer stays where it is (shared memory on CPU, device memory on GPU) and only a
  serialized handle crosses to the engine -> `update_weights_from_tensor(load_format="flattened_bucket")`.
- `distributed` (`Distributed`): the trainer joins the engine's weight-update group exactly as SGLang builds it and
  broadcasts each flat buffer while the engine receives it in `update_weights_from_distributed`.
- `direct` (`Direct`): no flat buffer; the engine shares its parameters in place and the trainer writes each tensor
  straight into them (one copy instead of two; CPU engines at TP=1, labkit's models).

`send()` returns only when the engine has loaded the bucket; the session overlaps packing the next bucket with it by
running `send()` on a worker thread. No wait is unbounded: every engine call and collective made by a transport carries
`timeout_s`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from labkit.cluster import runtime
from labkit.cluster.placement import PlacementError, cross_node
from labkit.sync.config import TRANSPORTS
from labkit.sync.plan import Bucket, Plan
from labkit.sync.transports.colocated import Colocated
from labkit.sync.transports.direct import Direct, Mappings
from labkit.sync.transports.distributed import PORT_ATTEMPTS, Distributed, bind_store, join_group
from labkit.sync.transports.per_tensor import PerTensor

__all__ = ["Transport", "make", "where", "PerTensor", "Colocated", "Distributed", "Direct", "Mappings",
           "bind_store", "join_group", "PORT_ATTEMPTS"]


class Transport(Protocol):
    """What the syncer asks of a transport (labkit.sync.session), in call order: `open` once per sync, after
    begin_weight_update; `send` per bucket, from a worker thread; `close` once, also on failure (best effort).
    Optional: `packs_into_stage` true after `open` if a bucket may be packed straight into the atomic guard's
    staging copy (colocated: the engine reads it there; distributed: broadcast from there); the syncer then sets
    `files` to that writer (labkit.sync.lastgood.Writer.locate)."""

    name: str  # SyncConfig.transport
    flattened: bool  # send() wants the packed flat buffer (else the bucket's exported tensors)
    port_retries: int  # rendezvous ports found taken this sync (metric sync/port_retries)
    same_node: bool  # hands the engine a memory handle (shared memory, CUDA IPC): trainer and engine share a node

    def open(self, engine, plan: Plan) -> None: ...

    def send(self, engine, b: Bucket, tensors: dict[str, torch.Tensor] | None = None,
             flat: torch.Tensor | None = None) -> dict:
        """Returns once the engine loaded bucket `b`: seconds by phase ({"encode", "transfer", "load"})."""
        ...

    def close(self, engine) -> None: ...


def make(name: str, timeout_s: float = 120.0, delta=None, maps: Mappings | None = None,
         engine_loader: str = "auto") -> Transport:
    """`delta`: a labkit.sync.delta.DeltaState (colocated and distributed only); `maps`: the engine's parameter
    files the direct transport keeps mapped across syncs (the Syncer's); `engine_loader`: SyncConfig.engine_loader."""
    if delta is not None and name in ("direct", "per-tensor"):
        raise ValueError(f"transport={name!r} cannot carry a delta: use colocated or distributed")
    if name == "direct":
        return Direct(maps if maps is not None else Mappings())
    if name == "per-tensor":
        return PerTensor()
    if name == "colocated":
        return Colocated(delta=delta, engine_loader=engine_loader)
    if name == "distributed":
        return Distributed(timeout_s=timeout_s, delta=delta, engine_loader=engine_loader)
    raise ValueError(f"transport={name!r} is invalid: expected one of {', '.join(TRANSPORTS)}")


def where(transport: Transport, engine) -> dict:
    """Where this trainer rank and the engine run, as Ray reports them (metrics sync/trainer_node, sync/engine_node,
    sync/cross_node), and over how many TP ranks the engine holds the weights (sync/engine_tp); a transport that
    hands the engine a memory handle is refused across nodes here, before the session opens (on the engine's node
    the handle names a shared-memory file that is not there)."""
    mine, theirs = runtime.here(), engine.node()
    cross = cross_node(mine, theirs)
    if cross and transport.same_node:
        raise PlacementError(f"transport={transport.name!r} hands the engine a shared-memory handle, so trainer "
                             f"and engine must share a node; the trainer rank runs on node {_name(mine)} and the "
                             f"engine on node {_name(theirs)}: use transport='distributed'")
    return {"sync/trainer_node": _name(mine), "sync/engine_node": _name(theirs), "sync/cross_node": cross,
            "sync/engine_tp": engine.tp_size}


def _name(node: dict) -> str:
    return f"{node.get('node_ip')}/{(node.get('node_id') or '-')[:8]}"
