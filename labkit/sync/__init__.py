"""labkit.sync: bucketed, flattened weight sync into an SGLang engine.

`sync(trainer, engine, cfg)` pushes a Megatron trainer's weights; `stream(named_tensors, engine, cfg)` pushes any
iterator of (HF name, tensor) pairs from this process (a safetensors file, an HF model's named_parameters()).
Both run the same `Syncer` (plan -> buckets -> transport -> verify) and, with cfg.atomic, the same guard.
"""

from __future__ import annotations

from labkit.sync.config import SyncConfig
from labkit.sync.producer import LocalProducer, Producer
from labkit.sync.spec import checked_expected, engine_spec

# Importing labkit.sync (its configs, the CLI's startup) loads no torch: the syncer and the guard, which cross
# torch, are imported where a sync runs. No submodule imports this package back (tests/unit/test_layers.py):
# what they share lives in submodules (spec, producer, verify.ENGINE_CHECKSUMS).

__all__ = ["SyncConfig", "sync", "stream", "engine_spec"]


def sync(trainer: Producer, engine, cfg: SyncConfig | None = None, weight_version: str | None = None,
         exclude: tuple[str, ...] = ()) -> dict:
    """Push the trainer's current weights into the engine in one weight-update session; returns metrics.

    `exclude` leaves out tensors whose names contain any of the given substrings (default: none): they keep
    their weights and are listed in `sync/unverified`. Any other engine tensor missing from the trainer's
    export, or a sync that would send nothing, is refused before anything is sent.
    With cfg.atomic (the default) the sync lands completely or the engine is restored to the last good
    weights before it serves again (labkit.sync.atomic; a failure raises SyncFailed saying which).
    """
    from labkit.sync.atomic import guard_for
    from labkit.sync.session import Syncer
    from labkit.sync.verify import ENGINE_CHECKSUMS

    cfg = cfg or SyncConfig()
    expected = checked_expected(engine, exclude)
    if cfg.atomic:
        return guard_for(engine).sync(trainer, cfg, expected, weight_version, tuple(exclude))
    m = trainer.export_to(Syncer(), engine.portable(), cfg, expected, weight_version, exclude=tuple(exclude))
    m.pop(ENGINE_CHECKSUMS, None)
    if cfg.probe:  # not atomic: a failing probe is raised, and the engine keeps the weights it got
        from labkit.engine.errors import EngineError
        from labkit.sync import probe

        m.update(probe.measure(trainer, engine, cfg.probe, probe.vocab_of(expected)))
        if (why := probe.verdict(m, probe.limit(cfg.probe_kl_max, expected))) is not None:
            raise EngineError(why + " (atomic=False: the engine keeps these weights)")
    return m


def stream(named_tensors, engine, cfg: SyncConfig | None = None, weight_version: str | None = None,
           exclude: tuple[str, ...] = ()) -> dict:
    """Push any iterable of (HF name, torch tensor) pairs into `engine` (an EngineHandle), from this process.

    >>> from safetensors.torch import load_file
    >>> m = stream(load_file("model.safetensors").items(), engine, SyncConfig(transport="colocated"))
    >>> m["sync/verified"]
    True

    No trainer is involved: the tensors are planned into buckets, sent, and verified against the engine's
    checksums exactly as `sync` does (the same `Syncer`, run here). Names and shapes must be the engine's
    (every engine tensor not excluded must be present, as in `sync`); tensors are cast to its dtype on the way.
    With cfg.atomic (the default) the same guard applies: the sync lands verified or the engine is restored to
    the last good weights (SyncFailed). The iterator runs in this process and cannot be killed, so
    `cfg.deadline_s` does not apply; every engine call is bounded by `cfg.timeout_s`. Each call plans afresh
    (there is no trainer to keep a replayed plan in), so the pairs are read into a list first, as a trainer's
    first sync does, and frees its buffers before it returns. Any order is fine: the pairs are reordered so
    that the tensors the engine fuses on load (q/k/v, gate/up) come together, as a model's own export has them
    and as the plan's buckets need (a safetensors file lists names alphabetically). For the same reason
    `cfg.delta` is refused: it needs a copy of the engine's weights kept between calls, and this keeps none.
    """
    from labkit.sync.atomic import guard_for
    from labkit.sync.session import Syncer
    from labkit.sync.verify import ENGINE_CHECKSUMS

    cfg = cfg or SyncConfig()
    if cfg.delta:
        raise ValueError(f"stream(): SyncConfig.delta={cfg.delta} needs a copy of the engine's weights kept between "
                         "calls, and stream() keeps none (each call plans afresh); use delta=0 here, or "
                         "labkit.sync.sync() from a trainer, which keeps it")
    if cfg.probe:
        raise ValueError(f"stream(): SyncConfig.probe={cfg.probe} compares the engine with a trainer's forward, and "
                         "stream() has only tensors; use probe=0 here, or labkit.sync.sync() from a trainer")
    expected = checked_expected(engine, exclude)
    producer = LocalProducer(named_tensors)
    if cfg.atomic:
        return guard_for(engine).sync(producer, cfg, expected, weight_version, tuple(exclude))
    m = producer.export_to(Syncer(), engine.portable(call_timeout_s=cfg.timeout_s), cfg, expected, weight_version,
                      exclude=tuple(exclude))
    m.pop(ENGINE_CHECKSUMS, None)
    return m
