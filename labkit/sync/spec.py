"""What the engine expects a sync to send: its model's tensors, dtype and FFN padding (`engine_spec`), checked
against a caller's `exclude` before anything is sent (`checked_expected`).

Torch-free (importing labkit.sync loads no torch). A submodule, not the package face, because the guard and the
replicas use it too: importing `labkit.sync` back would close an import loop through the package's own `sync()`.
"""

from __future__ import annotations

from labkit.config import check
from labkit.engine.contract import Contract, ffn_padding

__all__ = ["engine_spec", "checked_expected"]


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
    if exclude and all(any(x in n for x in exclude) for n in expected["tensors"]):
        raise ValueError(f"empty sync refused: exclude={tuple(exclude)!r} names all {len(expected['tensors'])} tensors "
                         "of the engine's model; nothing would be sent or verified")
    return expected
