"""Every tensor a sync moves, from a model's config.json alone: HF names, shapes and dtypes, no weights, no torch.

The roofline (labkit.lab.roofline.bounds) needs what a sync of a real model would carry (bytes, tensor count, how the
planner cuts it into buckets) without downloading it. Names and shapes are labkit.models.naming's (the naming
labkit's tiny checkpoints are written from, one tensor per expert projection as HF checkpoints and SGLang's
loaders have them), so tensor counts here are the counts a per-tensor or bucketed sync pays for. This module adds
what only a sync has: the dtype each tensor travels in and, for `weights="fp8"`, DeepSeek's block FP8 as its
checkpoints and FP8 rollouts hold it: every attention/MLP projection in e4m3 (1 byte) plus a float32
`weight_scale_inv` per 128x128 block; embeddings, head, norms and routers stay bf16. `count_buckets` is the
length of labkit's planner's own plan (labkit.sync.plan.plan_buckets).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, get_args

from labkit.models import naming
from labkit.models.naming import ARCHITECTURES
from labkit.models.real import REAL
from labkit.sync.plan import TensorMeta, check_bucket_bytes, plan_buckets

Weights = Literal["bf16", "fp8", "fp32"]
WEIGHTS = get_args(Weights)
LABKIT_SIZES = ("tiny", "quick", "bench")  # labkit.models.tiny.SIZES: the family labkit's benches sync
FP8_BLOCK = 128
_DTYPE = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class ModelTensors:
    """A model's tensors as one sync carries them."""

    label: str
    """Where the config came from (a shipped name, a path)."""
    architecture: str
    """The family its names follow (one of ARCHITECTURES)."""
    weights: str
    """bf16, fp8 (block FP8 projections + scales) or fp32."""
    mtp_layers: int
    """MTP layers counted (0 when the model has none or mtp=False)."""
    tensors: tuple[TensorMeta, ...]
    """In export order: the planner packs greedily in this order."""

    @functools.cached_property  # sums over up to ~140k tensors, asked for by every table
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @functools.cached_property
    def params(self) -> int:
        """Parameters (elements of every tensor but the FP8 scales), the number a model card quotes."""
        return sum(math.prod(t.shape) for t in self.tensors if not t.name.endswith("_scale_inv"))

    @functools.cached_property
    def expert_tensors(self) -> int:
        return sum(".mlp.experts." in t.name for t in self.tensors)

    def buckets(self, bucket_bytes: int) -> int:
        """`count_buckets` of these tensors, planned once per bucket size (every row of a table asks again)."""
        check_bucket_bytes(bucket_bytes)
        planned = self.__dict__.setdefault("_buckets", {})  # frozen: filled like a cached_property
        if bucket_bytes not in planned:
            planned[bucket_bytes] = count_buckets(self.tensors, bucket_bytes)
        return planned[bucket_bytes]


def names() -> tuple[str, ...]:
    """The model names `model_tensors` knows without a path."""
    return (*REAL, *LABKIT_SIZES)


def load_config(model: str | Path | dict) -> tuple[str, dict]:
    """(label, config dict) of a shipped name, a config.json path, a model directory, or a dict."""
    if isinstance(model, dict):
        return str(model.get("_name", "config")), model
    if str(model) in REAL:
        return REAL[str(model)]["_name"], REAL[str(model)]
    if str(model) in LABKIT_SIZES:
        from labkit.models import tiny

        spec = tiny.SIZES[str(model)]
        cfg = json.loads((tiny.DEFAULT_DIR / "config.json").read_text()) if spec is None else tiny.hf_config(spec)
        return f"labkit {model} MiMo", cfg
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"model={str(model)!r} is invalid: expected one of {', '.join(names())}, a config.json "
                         "path or a model directory")
    return str(model), json.loads(path.read_text())


def architecture(cfg: dict, where: str = "config") -> str:
    """The family a config's tensors are named by; a ValueError naming the model_type and the supported ones."""
    arch = naming.architecture(cfg)
    if arch is None:
        raise ValueError(f"model_type={cfg.get('model_type')!r} in {where} is not supported by the roofline: "
                         f"expected one of {', '.join(ARCHITECTURES)} (or kimi_k2)")
    return arch


def model_tensors(model: str | Path | dict, weights: Weights = "bf16", mtp: bool = True) -> ModelTensors:
    """Every tensor of `model` (see `load_config`) as a sync would carry it in `weights`; `mtp=False` leaves MTP
    layers out (RL recipes that disable MTP, e.g. verl's DeepSeek-V3 one, do not sync them)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r} is invalid: expected one of {', '.join(WEIGHTS)}")
    if isinstance(model, str) and model in names():
        return _named(model, weights, bool(mtp))
    return _enumerate(model, weights, mtp)


@functools.lru_cache(maxsize=32)
def _named(model: str, weights: str, mtp: bool) -> ModelTensors:
    """Shipped configs never change within a process: enumerate each (model, weights, mtp) once."""
    return _enumerate(model, weights, mtp)


def _enumerate(model: str | Path | dict, weights: str, mtp: bool) -> ModelTensors:
    label, cfg = load_config(model)
    arch = architecture(cfg, label)
    n_mtp = int(cfg.get("num_nextn_predict_layers") or 0) if mtp else 0
    shapes = naming.hf_tensors(cfg, n_mtp)
    return ModelTensors(label, arch, weights, n_mtp, tuple(_typed(shapes, weights)))


def _typed(shapes: list[tuple[str, tuple[int, ...]]], weights: str):
    dtype = _DTYPE[weights]
    for name, shape in shapes:
        if weights == "fp8" and _quantized(name, shape):
            yield TensorMeta(name, shape, "float8_e4m3fn")
            yield TensorMeta(name + "_scale_inv", tuple(-(-d // FP8_BLOCK) for d in shape), "float32")
        else:
            yield TensorMeta(name, shape, dtype)


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.endswith("_proj.weight") and (".self_attn." in name or ".mlp." in name)


def count_buckets(tensors: Iterable[TensorMeta], bucket_bytes: int) -> int:
    """How many buckets labkit's planner cuts `tensors` into: the length of labkit.sync.plan.plan_buckets' plan,
    so every rule of the planner (fused groups kept whole, a group larger than a bucket alone, duplicates
    dropped) holds here by construction."""
    return len(plan_buckets(tensors, bucket_bytes).buckets)


def largest_group_bytes(tensors: Iterable[TensorMeta]) -> int:
    """The largest fused group (the planner keeps one in one bucket): buckets smaller than it hold oversize
    groups that travel alone in fresh buffers, a cost of another kind than a bucket's. With 1-byte buckets the
    planner puts every group of more than one byte in a bucket of its own, so its largest bucket is this."""
    return plan_buckets(tensors, 1).largest_bucket_bytes
