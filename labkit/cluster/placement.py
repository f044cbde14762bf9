"""Where trainer ranks and engines run. The layout is a pure function; `Placement` makes it a Ray placement group.

colocated:      trainer rank i and engine i share bundle i (same node, same GPU on a GPU cluster: CUDA IPC).
disaggregated:  trainer ranks and engines get bundles of their own (weights cross by broadcast).

On a cluster of several nodes, `PlacementSpec.trainer_resource` / `engine_resource` pin each side to the nodes
that offer a custom Ray resource of that name (`ray start --resources '{"trainer": 8}'`): every bundle of that
side asks for a sliver of it (`PIN`), so the nodes decide, not bundle order. Whether two processes share a node
is answered from what Ray reports (`cross_node`), because the transports that hand over a memory handle (colocated,
per-tensor) cannot work across nodes, and a handle opened on the wrong node fails deep inside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from labkit.config import check, check_choice

MODES = ("colocated", "disaggregated")
Mode = Literal["colocated", "disaggregated"]
PIN = 0.001  # of a pinning resource per bundle: any node offering >= 1 of it takes up to 1,000 bundles


class PlacementError(ValueError):
    """A placement that cannot work: refused before anything starts or moves."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PlacementSpec:
    """Where the trainer's ranks and the engine run on the Ray cluster (local, or `RAY_ADDRESS`)."""

    mode: Mode = "colocated"
    """colocated: trainer rank i and engine i share a bundle (one node); disaggregated: bundles of their own."""
    trainer_resource: str = ""
    """A custom Ray node resource that pins the trainer ranks to the nodes offering it (empty: any node)."""
    engine_resource: str = ""
    """A custom Ray node resource that pins the engines to the nodes offering it (empty: any node)."""
    engines: int = 1
    """Rollout engines, synced together in one weight version (labkit.sync.fanout)."""

    def __post_init__(self) -> None:
        check_choice(self, "mode", "placement")
        check(isinstance(self.engines, int) and not isinstance(self.engines, bool) and self.engines >= 1, "engines",
              self.engines, "an integer >= 1")
        for name in ("trainer_resource", "engine_resource"):
            v = getattr(self, name)
            check(isinstance(v, str) and v == v.strip() and v not in ("CPU", "GPU", "memory"), name, v,
                  "the name of a custom Ray node resource, or '' (no pin)")
        if self.mode == "colocated" and self.trainer_resource and self.engine_resource \
                and self.trainer_resource != self.engine_resource:
            raise PlacementError(f"placement=colocated puts trainer rank i and engine i on one node, but "
                                 f"trainer_resource={self.trainer_resource!r} and engine_resource="
                                 f"{self.engine_resource!r} pin them to different nodes: use placement=disaggregated "
                                 "(and transport=distributed), or one resource for both")


@dataclass(frozen=True, slots=True)
class Layout:
    mode: str
    bundles: tuple[dict, ...]
    assign: dict  # role ("trainer:0", "engine:0") -> bundle index


def layout(mode: str | PlacementSpec, trainer_ranks: int, engines: int = 1, gpus_per_bundle: float = 0.0,
           cpus_per_bundle: float = 1.0) -> Layout:
    """The bundles and who sits in which; `mode` a PlacementSpec carries the node pins too."""
    spec = mode if isinstance(mode, PlacementSpec) else None
    mode = spec.mode if spec else mode
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is invalid: expected one of {', '.join(MODES)}")
    if trainer_ranks < 1 or engines < 1:
        raise ValueError(f"trainer_ranks={trainer_ranks}, engines={engines} are invalid: expected >= 1 each")
    res = {"CPU": cpus_per_bundle, **({"GPU": gpus_per_bundle} if gpus_per_bundle else {})}

    def bundle(*pins: str) -> dict:
        return {**res, **{p: PIN for p in pins if p}}

    pin_t, pin_e = (spec.trainer_resource, spec.engine_resource) if spec else ("", "")
    assign = {f"trainer:{i}": i for i in range(trainer_ranks)}
    if mode == "colocated":
        assign.update({f"engine:{i}": i for i in range(engines)})
        bundles = tuple(bundle(pin_t if i < trainer_ranks else "", pin_e if i < engines else "")
                        for i in range(max(trainer_ranks, engines)))
        return Layout(mode, bundles, assign)
    assign.update({f"engine:{i}": trainer_ranks + i for i in range(engines)})
    return Layout(mode, tuple([bundle(pin_t)] * trainer_ranks + [bundle(pin_e)] * engines), assign)


def cross_node(a: dict, b: dict) -> bool | None:
    """Whether two places ({"node_id", "node_ip"}, as `labkit.cluster.runtime.here()` reports them) are on
    different nodes; None where neither the node ids nor two non-loopback addresses can tell."""
    if a.get("node_id") and b.get("node_id"):
        return a["node_id"] != b["node_id"]
    ips = a.get("node_ip"), b.get("node_ip")
    if all(ips) and not any(ip in ("127.0.0.1", "localhost", "::1") for ip in ips):
        return ips[0] != ips[1]
    return None


class Placement:
    """A Ray placement group for a layout; `strategy(role)` pins an actor to its bundle."""

    def __init__(self, lay: Layout, timeout_s: float = 60.0):
        import ray
        from ray.util.placement_group import placement_group

        self.layout = lay
        self.pg = placement_group(list(lay.bundles), strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self.pg)
            raise PlacementError(f"placement {lay.mode} with bundles {list(lay.bundles)} not schedulable within "
                                 f"{timeout_s}s; cluster has {ray.cluster_resources()}") from None

    def strategy(self, role: str):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                placement_group_bundle_index=self.layout.assign[role])

    def remove(self) -> None:
        import ray

        ray.util.remove_placement_group(self.pg)
