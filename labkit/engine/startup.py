"""Starting a run's engines where its placement puts them: the Ray placement group for a trainer and its engines
(`place`), then the engines in their bundles (`start_engines`). The workbench and the MTP experiment both start
this way; the trainer starts in between, in its own bundles (labkit.trainer.group.Trainer(placement=...)).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from labkit.cluster import runtime
from labkit.cluster.placement import Placement, PlacementSpec, layout
from labkit.engine.config import EngineConfig
from labkit.engine.handle import EngineHandle

__all__ = ["place", "start_beside", "start_each", "start_engines"]

T = TypeVar("T")


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
    return start_each([cfg] * n, placement, started)


def start_each(cfgs: list[EngineConfig], placement: Placement | None = None,
               started: list | None = None) -> list[EngineHandle]:
    """Engine i from `cfgs[i]` in the placement's bundle "engine:i", as `start_engines` starts its `n` (the MTP
    experiment's plain engine beside its speculative twin)."""
    started = [] if started is None else started

    def strategy(i: int):
        return None if cfgs[i].url or placement is None else placement.strategy(f"engine:{i}")

    if len(cfgs) == 1:
        started.append(EngineHandle.start(cfgs[0], strategy(0)))
        return started
    with ThreadPoolExecutor(len(cfgs), thread_name_prefix="labkit-start") as pool:
        starts = [pool.submit(EngineHandle.start, c, strategy(i)) for i, c in enumerate(cfgs)]
    started.extend(f.result() for f in starts if f.exception() is None)
    for f in starts:
        if f.exception() is not None:
            raise f.exception()
    return started


def start_beside(start_other: Callable[[], T], cfg: EngineConfig, placement: Placement, n: int, started: list,
                 overlap: bool) -> T:
    """`start_other()` (a trainer's start) in this thread while `n` engines start in another (`start_engines`, into
    `started`); its result once both have ended. A trainer and an engine each spend most of a start importing and
    loading in their own processes, so side by side a start costs about the longer of the two. Either failure is
    raised once both have ended, the trainer's first, and every engine that started is in `started` for the
    caller to stop.

    `overlap=False` starts them one after the other: for a trainer and engines that share a GPU. SGLang sizes its
    KV-cache pool from the GPU memory free while it loads (`mem_fraction_static`); a trainer allocating on the same
    GPU at that moment changes that figure under it, and the pool comes out too large (an out-of-memory error at
    the first batch) or too small.
    """
    if not overlap:
        out = start_other()
        start_engines(cfg, placement, n, started=started)
        return out
    with ThreadPoolExecutor(1, thread_name_prefix="labkit-start") as pool:
        engines = pool.submit(start_engines, cfg, placement, n, started)
        try:
            out = start_other()
        finally:
            error = engines.exception()  # waits: the engines' start has ended, failed or not, before anything else
    if error is not None:
        raise error
    return out
