"""Who feeds a sync: the producer/consumer contract between what holds the weights and what moves them.

A sync moves weights into an engine (`labkit.sync.sync`, `Guard.sync`, `Replicas.sync`, `Workbench.sync`: the verb
`sync` means that and only that). The weights come from a *producer*, which moves nothing itself: it hands its (HF name,
tensor) pairs to a *consumer* where they are, and the consumer moves them into the engine.

- `Consumer`: the `labkit.sync.session.Syncer` (plan -> buckets -> transport -> verify). `run` takes the pairs and the
  engine and returns the sync's metrics; `close` frees its buffers (the colocated transport's shared-memory files). It
  is picklable: it crosses to the process that holds the tensors.
- `Producer`: `export_to(consumer, engine, cfg, ...)` calls `consumer.run(pairs, engine, cfg, ...)` where the pairs are
  and returns its metrics. The `Trainer` (labkit.trainer.group) is one: its ranks run the export collectively and rank 0
  runs the consumer, which it keeps between syncs (the replayed plan, the reusable buffers) and closes on `release`; it
  fences itself (kills its ranks) when `deadline_s` passes or the call is interrupted, so no late bucket reaches the
  engine. `LocalProducer` (`labkit.sync.stream`), over pairs already in this process, closes the consumer at once.

The guard (labkit.sync.atomic) and the replicas (labkit.sync.fanout) drive a producer and never reach into its
processes. The trainer implements the Protocol without importing it (imports point down: trainer/ is below sync/).
"""

from __future__ import annotations

from typing import Iterable, Protocol

from labkit.sync.plan import plan_group, standalone

__all__ = ["Consumer", "Producer", "LocalProducer"]


class Consumer(Protocol):
    """Moves (name, tensor) pairs into an engine: one weight-update session, verified (labkit.sync.session.Syncer)."""

    def run(self, named_iter: Iterable, engine, cfg, engine_spec: dict | None = None,
            weight_version: str | None = None, exclude: tuple[str, ...] = ()) -> dict: ...

    def close(self) -> None: ...


class Producer(Protocol):
    """Holds the weights and feeds them to a consumer (see the module's contract); moves nothing itself."""

    def export_to(self, consumer: Consumer, engine, cfg, engine_spec: dict | None = None,
                  weight_version: str | None = None, exclude: tuple[str, ...] = (),
                  deadline_s: float | None = None) -> dict: ...


class LocalProducer:
    """A producer over (name, tensor) pairs already in this process (`labkit.sync.stream`)."""

    def __init__(self, named_tensors):
        self.named_tensors = named_tensors

    def export_to(self, consumer: Consumer, engine, cfg, engine_spec: dict | None = None,
                  weight_version: str | None = None, exclude: tuple[str, ...] = (),
                  deadline_s: float | None = None) -> dict:
        named = list(self.named_tensors)
        first: dict[str, int] = {}
        alone = standalone(name for name, _ in named)
        for i, (name, _) in enumerate(named):
            first.setdefault(plan_group(name, alone), i)
        named.sort(key=lambda p: first[plan_group(p[0], alone)])  # stable: a group lands where its first member was
        try:
            return consumer.run(iter(named), engine, cfg, engine_spec, weight_version, exclude=tuple(exclude))
        finally:
            # The driver keeps no consumer between calls: free its (possibly shared-memory) buffers now.
            consumer.close()
