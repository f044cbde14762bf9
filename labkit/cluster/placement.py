"""Where trainer ranks and engines run. The layout is a pure function; `Placement` makes it a Ray placement group.

colocated:      trainer rank i and engine i share bundle i (same node, same GPU on a GPU cluster: CUDA IPC).
disaggregated:  trainer ranks and engines get bundles of their own (weights cross by broadcast).
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("colocated", "disaggregated")


@dataclass(frozen=True, slots=True)
class Layout:
    mode: str
    bundles: tuple[dict, ...]
    assign: dict  # role ("trainer:0", "engine:0") -> bundle index


def layout(mode: str, trainer_ranks: int, engines: int = 1, gpus_per_bundle: float = 0.0,
           cpus_per_bundle: float = 1.0) -> Layout:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is invalid: expected one of {', '.join(MODES)}")
    if trainer_ranks < 1 or engines < 1:
        raise ValueError(f"trainer_ranks={trainer_ranks}, engines={engines} are invalid: expected >= 1 each")
    res = {"CPU": cpus_per_bundle, **({"GPU": gpus_per_bundle} if gpus_per_bundle else {})}
    if mode == "colocated":
        n = max(trainer_ranks, engines)
        assign = {f"trainer:{i}": i for i in range(trainer_ranks)}
        assign.update({f"engine:{i}": i for i in range(engines)})
        return Layout(mode, tuple(dict(res) for _ in range(n)), assign)
    assign = {f"trainer:{i}": i for i in range(trainer_ranks)}
    assign.update({f"engine:{i}": trainer_ranks + i for i in range(engines)})
    return Layout(mode, tuple(dict(res) for _ in range(trainer_ranks + engines)), assign)


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
            raise RuntimeError(f"placement {lay.mode} with bundles {list(lay.bundles)} not schedulable within "
                               f"{timeout_s}s; cluster has {ray.cluster_resources()}") from None

    def strategy(self, role: str):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                placement_group_bundle_index=self.layout.assign[role])

    def remove(self) -> None:
        import ray

        ray.util.remove_placement_group(self.pg)
