"""Starting a run's engines where its placement puts them: the Ray placement group for a trainer and its engines
(`place`), then the engines in their bundles (`start_engines`). The workbench and the MTP experiment both start
this way; the trainer starts in between, in its own bundles (labkit.trainer.group.Trainer(placement=...)).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from labkit.cluster import runtime
from labkit.cluster.placement import Placement, PlacementSpec, layout
from labkit.engine.config import EngineConfig
from labkit.engine.handle import EngineHandle

__all__ = ["place", "start_engines"]


def place(spec: str | PlacementSpec, trainer_ranks: int) -> Placement:
    """Ray (started here, or attached: idempotent) and a placement group for `trainer_ranks` trainer ranks and the
    spec's engines (`spec`: a PlacementSpec, or a mode). Colocated: a trainer rank and the engine share a bundle
    (2 logical CPUs: one actor each)."""
    spec = spec if isinstance(spec, PlacementSpec) else PlacementSpec(mode=spec)
    runtime.init()
    cpus = 2.0 if spec.mode == "colocated" else 1.0
    return Placement(layout(spec, trainer_ranks, spec.engines, cpus_per_bundle=cpus))


def start_engines(cfg: EngineConfig, placement: Placement | None = None, n: int = 1,
                  started: list | None = None) -> list[EngineHandle]:
    """`n` engines from `cfg`, engine i in the placement's bundle "engine:i" (`cfg.url`: the server there, connected;
    no placement: wherever Ray puts it). Several start side by side (a model load each); one starts in this thread.

    Every engine that started is appended to `started` (returned; pass your own list to keep it when another one
    fails), so that the caller can stop it; then the first failure is raised.
    """
    started = [] if started is None else started

    def strategy(i: int):
        return None if cfg.url or placement is None else placement.strategy(f"engine:{i}")

    if n == 1:
        started.append(EngineHandle.start(cfg, strategy(0)))
        return started
    with ThreadPoolExecutor(n, thread_name_prefix="labkit-start") as pool:
        starts = [pool.submit(EngineHandle.start, cfg, strategy(i)) for i in range(n)]
    started.extend(f.result() for f in starts if f.exception() is None)
    for f in starts:
        if f.exception() is not None:
            raise f.exception()
    return started
