"""What the engine expects a sync to send: its model's tensors, dtype and FFN padding (`engine_spec`), checked
against a caller's `exclude` before anything is sent (`checked_expected`).

Torch-free (importing labkit.sync loads no torch). A submodule, not the package face, because the guard and the
replicas use it too: importing `labkit.sync` back would close an import loop through the package's own `sync()`.
"""

from __future__ import annotations

from labkit.config import check
from labkit.engine.contract import Contract, ffn_padding
from labkit.engine.shard import Sharding

__all__ = ["engine_spec", "checked_expected", "sharding_of", "sharding", "refuse_unsupported"]


def engine_spec(model_dir: str, dtype: str = "auto", ffn_pad: int = 1) -> dict:
    """What the engine's model expects (labkit.engine.contract.Contract, as a plain dict): {"tensors": {HF name:
    (shape, dtype)}, "dtype": its serving dtype, "ffn_pad": the multiple its FFN widths are padded to, "quant":
    a block-FP8 checkpoint's recipe or None}. A sync adds "checksum", the hash its weight checker runs
    (EngineHandle.checksum_algo; absent: labkit's default)."""
    return (Contract.find(model_dir, dtype) or Contract.from_model_dir(model_dir, dtype)).spec(ffn_pad)


def checked_expected(engine, exclude) -> dict:
    """What the engine expects (engine_spec), after refusing an `exclude` that is not a tuple of substrings or that
    names everything."""
    # A bare string would exclude by its characters; "" matches every name.
    check(isinstance(exclude, (tuple, list)) and all(isinstance(x, str) and x for x in exclude), "exclude",
          exclude, "a tuple of non-empty name substrings")
    expected = engine_spec(engine.cfg.model_dir, engine.cfg.dtype, ffn_padding(engine.device, engine.tp_size))
    expected["checksum"] = engine.checksum_algo()  # the engine checker's hash: the trainer hashes the same way
    expected["sharding"] = sharding_of(engine.cfg.model_dir, engine.tp_size, engine.device).spec()
    expected["draft"] = getattr(engine.cfg, "speculative", None) is not None  # a draft runner (labkit.engine.draft)
    if exclude and all(any(x in n for x in exclude) for n in expected["tensors"]):
        raise ValueError(f"empty sync refused: exclude={tuple(exclude)!r} names all {len(expected['tensors'])} tensors "
                         "of the engine's model; nothing would be sent or verified")
    return expected


def sharding_of(model_dir: str, tp: int, device: str = "cpu") -> Sharding:
    """The engine's sharding (labkit.engine.shard) at TP `tp`, its head counts from the model dir's config.json;
    refused (Unsupported, naming the field) where labkit cannot say what each rank holds."""
    if tp == 1:
        return Sharding()
    from labkit.models.hf import check_model_dir

    return Sharding.of_config(check_model_dir(model_dir), tp, device)


def sharding(spec: dict | None) -> Sharding:
    """The Sharding a spec (`checked_expected`) carries; tp 1 where it carries none."""
    return Sharding(**(spec or {}).get("sharding", {}))


def refuse_unsupported(cfg, spec: dict) -> None:
    """What a sync into this engine cannot do yet, refused before anything moves (Unsupported, naming the setting).
    At TP > 1: a full read-back (labkit reads whole tensors from TP 1 engines) and a delta sync (its payload is the
    changed words of whole tensors, while each rank holds a piece). With a draft runner: transport="direct" (the
    trainer writes the target runner's parameters in place; the draft runner holds copies of its own)."""
    from labkit.engine.errors import Unsupported

    if spec.get("draft") and cfg.transport == "direct":
        raise Unsupported("transport='direct' writes the target runner's parameters in place, and this engine's "
                          "speculative draft runner holds its own copy of the MTP layer, which would stay stale; "
                          "use transport='colocated', 'distributed' or 'per-tensor'")

    tp = sharding(spec).tp
    if tp > 1 and cfg.verify == "full":
        raise Unsupported(f"verify='full' reads every tensor back whole, which labkit does from engines at tp 1 "
                          f"only (this one runs tp={tp}); verify='checksum' compares every rank's piece")
    if tp > 1 and cfg.delta:
        raise Unsupported(f"delta={cfg.delta} sends the changed words of whole tensors, and each rank of this engine "
                          f"(tp={tp}) holds a piece; sync with delta=0")
