"""What an engine's model accepts, checked on the driver before a weight update is sent.

SGLang's loaders look tensors up by name and copy them into the parameter in place: an unknown name or a
wrong shape fails inside the scheduler, after some tensors of the same request may already be loaded (and a
shape mismatch in a fused loader can take the scheduler down). labkit therefore checks names and shapes
against the model directory's checkpoint headers (the HF names the engine's loader accepts) first and
refuses the whole request, so nothing reaches the engine.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from labkit.engine.errors import EngineError


@lru_cache(maxsize=8)
def _spec(model_dir: str, mtime: float) -> dict[str, tuple[int, ...]]:
    from labkit.models.hf import checkpoint_tensors

    return {n: tuple(shape) for n, (shape, _) in checkpoint_tensors(model_dir).items()}


def model_spec(model_dir: str) -> dict[str, tuple[int, ...]] | None:
    """{HF name: shape} of the engine's checkpoint; None when labkit cannot see it (a remote engine)."""
    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors")) if d.is_dir() else []
    if not files:
        return None
    return _spec(str(d.resolve()), max(f.stat().st_mtime for f in files))


def check_update(spec: dict[str, tuple[int, ...]] | None, items, call: str) -> None:
    """`items`: (name, shape) pairs about to be sent. Raises EngineError naming every bad tensor."""
    if spec is None:
        return
    problems = []
    for name, shape in items:
        if not isinstance(name, str):
            problems.append(f"{name!r}: a tensor name must be a string")
        elif name not in spec:
            problems.append(f"{name!r}: not a weight of the engine's model")
        elif tuple(shape) != spec[name]:
            problems.append(f"{name!r}: shape {tuple(shape)} != engine {spec[name]}")
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise EngineError(f"{call} refused before sending (the engine keeps its weights): "
                          + "; ".join(problems[:5]) + more)
