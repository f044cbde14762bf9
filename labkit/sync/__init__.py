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
    cfg = cfg or SyncConfig()
    expected = checked_expected(engine, exclude)
    m = _run(trainer, engine, cfg, expected, weight_version, exclude)
    if cfg.probe and not cfg.atomic:  # not atomic: a failing probe is raised, and the engine keeps the weights it got
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

    No trainer is involved: the same `Syncer` as `sync`'s runs here (plan, send, verify against the engine's checksums).
    Names and shapes must be the engine's, every engine tensor not excluded present (as in `sync`); tensors are cast to
    its dtype on the way. cfg.atomic (the default) applies the same guard: the sync lands verified or the engine is
    restored to the last good weights (SyncFailed). The iterator runs in this process and cannot be killed, so
    `cfg.deadline_s` does not apply; every engine call is bounded by `cfg.timeout_s`. No trainer keeps a replayed plan
    between calls: each call reads the pairs into a list and plans afresh, as a trainer's first sync does, and frees its
    buffers before it returns (so `cfg.delta`, which needs a copy of the engine's weights kept between calls, is
    refused). Any order is fine: the pairs are regrouped so the tensors the engine fuses on load (q/k/v, gate/up) come
    together, as a model's export has them and the plan's buckets need (a safetensors file lists names alphabetically).
    """
    cfg = cfg or SyncConfig()
    if cfg.delta:
        raise ValueError(f"stream(): SyncConfig.delta={cfg.delta} needs a copy of the engine's weights kept between "
                         "calls, and stream() keeps none (each call plans afresh); use delta=0 here, or "
                         "labkit.sync.sync() from a trainer, which keeps it")
    if cfg.probe:
        raise ValueError(f"stream(): SyncConfig.probe={cfg.probe} compares the engine with a trainer's forward, and "
                         "stream() has only tensors; use probe=0 here, or labkit.sync.sync() from a trainer")
    return _run(LocalProducer(named_tensors), engine, cfg, checked_expected(engine, exclude), weight_version,
                exclude, call_timeout_s=cfg.timeout_s)


def _run(producer: Producer, engine, cfg: SyncConfig, expected: dict, weight_version: str | None,
         exclude: tuple[str, ...], call_timeout_s: float | None = None) -> dict:
    """What `sync` and `stream` share: the guard with cfg.atomic, else the Syncer alone (its private key dropped)."""
    from labkit.sync.atomic import guard_for
    from labkit.sync.session import Syncer
    from labkit.sync.spec import refuse_unsupported
    from labkit.sync.verify import ENGINE_CHECKSUMS

    refuse_unsupported(cfg, expected)
    if cfg.atomic:
        return guard_for(engine).sync(producer, cfg, expected, weight_version, tuple(exclude))
    m = producer.export_to(Syncer(), engine.portable(call_timeout_s=call_timeout_s), cfg, expected, weight_version,
                           exclude=tuple(exclude))
    m.pop(ENGINE_CHECKSUMS, None)
    return m
