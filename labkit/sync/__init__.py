"""labkit.sync: bucketed, flattened weight sync trainer -> engine. `sync(trainer, engine, cfg)` is the entry point."""

from __future__ import annotations

from labkit.config import check
from labkit.engine.contract import Contract
from labkit.sync.config import SyncConfig

__all__ = ["SyncConfig", "sync", "engine_spec"]


def engine_spec(model_dir: str, dtype: str = "auto") -> dict:
    """What the engine's model expects (labkit.engine.contract.Contract, as a plain dict): {"tensors": {HF name:
    (shape, dtype)}, "dtype": its serving dtype}."""
    return Contract.from_model_dir(model_dir, dtype).spec()


def sync(trainer, engine, cfg: SyncConfig | None = None, weight_version: str | None = None,
         exclude: tuple[str, ...] = ()) -> dict:
    """Push the trainer's current weights into the engine in one weight-update session; returns metrics.

    `exclude` leaves out tensors whose names contain any of the given substrings (default: none): they keep
    their weights and are listed in `sync/unverified`. Any other engine tensor missing from the trainer's
    export, or a sync that would send nothing, is refused before anything is sent.
    With cfg.atomic (the default) the sync lands completely or the engine is restored to the last good
    weights before it serves again (labkit.sync.atomic; a failure raises SyncFailed saying which).
    """
    cfg = cfg or SyncConfig()
    # A bare string would exclude by its characters; "" matches every name.
    check(isinstance(exclude, (tuple, list)) and all(isinstance(x, str) and x for x in exclude), "exclude",
          exclude, "a tuple of non-empty name substrings")
    spec = engine_spec(engine.cfg.model_dir, engine.cfg.dtype)
    if exclude and all(any(x in n for x in exclude) for n in spec["tensors"]):
        raise ValueError(f"empty sync refused: exclude={tuple(exclude)!r} names all {len(spec['tensors'])} tensors "
                         "of the engine's model; nothing would be sent or verified")
    if cfg.atomic:
        from labkit.sync.atomic import guard_for

        return guard_for(engine).sync(trainer, cfg, spec, weight_version, tuple(exclude))
    return trainer.sync(engine.portable(), cfg, spec, weight_version, exclude=tuple(exclude))
