"""labkit.sync: bucketed, flattened weight sync into an SGLang engine.

`sync(trainer, engine, cfg)` pushes a Megatron trainer's weights; `stream(named_tensors, engine, cfg)` pushes any
iterator of (HF name, tensor) pairs from this process (a safetensors file, an HF model's named_parameters()).
Both run the same `Syncer` (plan -> buckets -> transport -> verify) and, with cfg.atomic, the same guard.
"""

from __future__ import annotations

from labkit.config import check
from labkit.engine.contract import Contract, ffn_padding
from labkit.sync.config import SyncConfig
from labkit.sync.plan import plan_group

# Private metrics key: the engine's checksums read by verification, handed to the atomic guard (its "after")
# so the whole model is not hashed twice per sync; `sync()`/`stream()` drop it before returning.
ENGINE_CHECKSUMS = "_engine_checksums"

# Importing labkit.sync (its configs, the CLI's startup) loads no torch: the syncer and the guard, which cross
# torch, are imported where a sync runs.

__all__ = ["SyncConfig", "sync", "stream", "engine_spec"]


def engine_spec(model_dir: str, dtype: str = "auto", ffn_pad: int = 1) -> dict:
    """What the engine's model expects (labkit.engine.contract.Contract, as a plain dict): {"tensors": {HF name:
    (shape, dtype)}, "dtype": its serving dtype, "ffn_pad": the multiple its FFN widths are padded to}. A sync
    adds "checksum", the hash its weight checker runs (EngineHandle.checksum_algo; absent: labkit's default)."""
    return (Contract.find(model_dir, dtype) or Contract.from_model_dir(model_dir, dtype)).spec(ffn_pad)


def sync(trainer, engine, cfg: SyncConfig | None = None, weight_version: str | None = None,
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

    cfg = cfg or SyncConfig()
    expected = _checked_expected(engine, exclude)
    if cfg.atomic:
        return guard_for(engine).sync(trainer, cfg, expected, weight_version, tuple(exclude))
    m = trainer.sync(Syncer(), engine.portable(), cfg, expected, weight_version, exclude=tuple(exclude))
    m.pop(ENGINE_CHECKSUMS, None)
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

    cfg = cfg or SyncConfig()
    if cfg.delta:
        raise ValueError(f"stream(): SyncConfig.delta={cfg.delta} needs a copy of the engine's weights kept between "
                         "calls, and stream() keeps none (each call plans afresh); use delta=0 here, or "
                         "labkit.sync.sync() from a trainer, which keeps it")
    expected = _checked_expected(engine, exclude)
    producer = _Local(named_tensors)
    if cfg.atomic:
        return guard_for(engine).sync(producer, cfg, expected, weight_version, tuple(exclude))
    m = producer.sync(Syncer(), engine.portable(call_timeout_s=cfg.timeout_s), cfg, expected, weight_version,
                      exclude=tuple(exclude))
    m.pop(ENGINE_CHECKSUMS, None)
    return m


class _Local:
    """A producer (see labkit.sync.atomic) over (name, tensor) pairs already in this process."""

    def __init__(self, named_tensors):
        self.named_tensors = named_tensors

    def sync(self, consumer, engine, cfg, engine_spec: dict | None = None, weight_version: str | None = None,
             exclude: tuple[str, ...] = (), deadline_s: float | None = None) -> dict:
        named = list(self.named_tensors)
        first: dict[str, int] = {}
        for i, (name, _) in enumerate(named):
            first.setdefault(plan_group(name), i)
        named.sort(key=lambda p: first[plan_group(p[0])])  # stable: a group lands where its first member was
        try:
            return consumer.run(iter(named), engine, cfg, engine_spec, weight_version, exclude=tuple(exclude))
        finally:
            # The driver keeps no consumer between calls: free its (possibly shared-memory) buffers now.
            consumer.close()


def _checked_expected(engine, exclude) -> dict:
    """What the engine expects (engine_spec), after refusing an `exclude` that is not a tuple of substrings or that
    names everything."""
    # A bare string would exclude by its characters; "" matches every name.
    check(isinstance(exclude, (tuple, list)) and all(isinstance(x, str) and x for x in exclude), "exclude",
          exclude, "a tuple of non-empty name substrings")
    expected = engine_spec(engine.cfg.model_dir, engine.cfg.dtype, ffn_padding(engine.device, engine.tp_size))
    expected["checksum"] = engine.checksum_algo()  # the engine checker's hash: the trainer hashes the same way
    if exclude and all(any(x in n for x in exclude) for n in expected["tensors"]):
        raise ValueError(f"empty sync refused: exclude={tuple(exclude)!r} names all {len(expected['tensors'])} tensors "
                         "of the engine's model; nothing would be sent or verified")
    return expected
