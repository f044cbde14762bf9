"""Bucket planning: from (name, shape, dtype) to buckets of at most `bucket_bytes`. Pure Python, no torch.

A plan is computed once and replayed every sync (the tensor list of a policy never changes between steps). Rules, each
one a failure someone shipped:
- groups of names that the engine fuses on load (labkit.engine.contract: q/k/v -> qkv_proj, gate/up -> gate_up_proj)
  never split across buckets: a half-landed group leaves the engine with dummy weights (train-vs-rollout KL ~1.5);
- a tensor or group larger than a bucket travels alone, and counts in the memory figure;
- duplicate names are dropped (PP>1 + MTP re-exports the shared embedding);
- inside a bucket, tensors are ordered by decreasing item size so every byte offset is aligned for its dtype (SGLang's
  receive-side FlattenedTensorBucket.empty checks this).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from labkit.engine.contract import call_group, check_tensors, fused_group, plan_group, standalone  # noqa: F401
from labkit.models import fp8
from labkit.sync.config import MB, SyncConfig

ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


# `nbytes` is computed once, on construction: a replayed plan reads it for every tensor of every sync.
@dataclass(frozen=True, slots=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"dtype={self.dtype!r} of {self.name} is not supported: "
                             f"expected one of {sorted(ITEMSIZE)}")
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ValueError(f"shape={self.shape!r} of {self.name} is invalid: expected non-negative integers")
        object.__setattr__(self, "nbytes", math.prod(self.shape) * ITEMSIZE[self.dtype])


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    tensors: tuple[TensorMeta, ...]
    oversize: bool = False  # holds one tensor/group larger than the bucket size
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", sum(t.nbytes for t in self.tensors))

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


@dataclass(frozen=True, slots=True)
class Plan:
    bucket_bytes: int
    buckets: tuple[Bucket, ...]
    dropped: tuple[str, ...] = field(default=())  # duplicate names seen and dropped

    @property
    def tensors(self) -> list[TensorMeta]:
        return [t for b in self.buckets for t in b.tensors]

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def largest_bucket_bytes(self) -> int:
        return max((b.nbytes for b in self.buckets), default=0)

    @property
    def largest_tensor_bytes(self) -> int:
        return max((t.nbytes for t in self.tensors), default=0)

    def overlaps(self, i: int) -> bool:
        """May bucket i+1 be packed while bucket i loads? Not when both are oversize (keeps peak <= 2B + L)."""
        return not (self.buckets[i].oversize and self.buckets[i + 1].oversize)

    @property
    def peak_extra_bytes(self) -> int:
        """Extra memory while syncing: the bucket being loaded plus the next one being packed."""
        b = self.buckets
        pairs = [b[i].nbytes + b[i + 1].nbytes if self.overlaps(i) else max(b[i].nbytes, b[i + 1].nbytes)
                 for i in range(len(b) - 1)]
        return max(pairs + [self.largest_bucket_bytes])


def check_bucket_bytes(bucket_bytes: object, budget_bytes: int | None = None) -> int:
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} is invalid: expected a positive integer number of bytes")
    if budget_bytes is not None and 2 * bucket_bytes > budget_bytes:
        raise ValueError(f"bucket_bytes={bucket_bytes} is invalid: two buckets in flight need {2 * bucket_bytes} "
                         f"bytes, over the memory budget of {budget_bytes} bytes")
    return bucket_bytes


def plan_buckets(tensors: Iterable[TensorMeta], bucket_bytes: int,
                 group: Callable[[str, frozenset[str]], str] = plan_group, budget_bytes: int | None = None) -> Plan:
    """Greedy, order-preserving packing of groups into buckets of at most `bucket_bytes`. `group(name, alone)`:
    the unit never split (`alone`: the tensors' `standalone` names)."""
    check_bucket_bytes(bucket_bytes, budget_bytes)
    tensors = list(tensors)
    alone = standalone(t.name for t in tensors)
    seen, dropped, groups = set(), [], {}  # groups: group key -> its tensors, in first-seen order
    for t in tensors:
        if t.name in seen:
            dropped.append(t.name)
            continue
        seen.add(t.name)
        groups.setdefault(group(t.name, alone), []).append(t)

    buckets: list[Bucket] = []
    current: list[TensorMeta] = []
    filled = 0  # bytes in `current`, kept as it grows: a sum per group would be quadratic in a bucket's tensors

    def close(items: list[TensorMeta], oversize: bool = False) -> None:
        if items:
            items = sorted(items, key=lambda t: -ITEMSIZE[t.dtype])  # stable: keeps order within a dtype
            buckets.append(Bucket(len(buckets), tuple(items), oversize))

    for items in groups.values():
        size = sum(t.nbytes for t in items)
        if size > bucket_bytes:
            close(current)
            current, filled = [], 0
            close(items, oversize=True)
        elif filled + size > bucket_bytes:
            close(current)
            current, filled = list(items), size
        else:
            current.extend(items)
            filled += size
    close(current)
    return Plan(bucket_bytes, tuple(buckets), tuple(dropped))


def excluding(named: Iterable, exclude: tuple[str, ...], excluded: list[str]):
    """(name, tensor) pairs minus names containing any of `exclude` (those are appended to `excluded`)."""
    for name, t in named:
        if any(x in name for x in exclude):
            excluded.append(name)
            continue
        yield name, t


def check_coverage(plan: Plan, engine: dict | None, exclude: tuple[str, ...] = (),
                   n_excluded: int = 0) -> list[str] | None:
    """Refuse a sync that sends nothing, that does not match the engine's model (`engine`: {name: (shape,
    dtype)}, the contract's names, shapes and dtypes), or that leaves an engine tensor out without the caller
    naming it (`exclude`): only sent tensors are verified, so either would "verify" while serving stale weights.
    Returns the engine tensors left unchanged on purpose (None without the engine's tensor list)."""
    if not plan.tensors:
        why = (f"exclude={exclude!r} matched all {n_excluded} tensors of the trainer's export" if n_excluded
               else "the trainer's export has no tensors")
        raise ValueError(f"empty sync refused: {why}; nothing would be sent or verified")
    if engine is None:
        return None
    check_tensors(engine, ((t.name, t.shape, t.dtype) for t in plan.tensors), "sync plan")
    sent = {t.name for t in plan.tensors}
    other = {n: fp8.weight_of(n) or n + fp8.SCALE_SUFFIX for n in sent}  # a scale's weight, a weight's scale
    unpaired = [n for n, o in other.items() if o in engine and o not in sent
                and (fp8.weight_of(n) is not None or engine[n][1] == fp8.E4M3)]
    if unpaired:
        raise ValueError(f"sync refused: {len(unpaired)} block-FP8 weights or scales would travel without their "
                         f"other half (e.g. {sorted(unpaired)[:3]}); the engine would serve a weight with a scale "
                         "it was not quantized with. Send or exclude a weight and its scale together")
    left = [n for n in engine if n not in sent]
    missing = [n for n in left if not any(x in n for x in exclude)]
    if missing:
        raise ValueError(f"incomplete sync refused: {len(missing)} engine tensors are not in the trainer's export "
                         f"and not excluded, they would keep stale weights (e.g. {missing[:3]}); name tensors "
                         "left unchanged on purpose with exclude=")
    return [n for n in left if any(x in n for x in exclude)]


def metas_of(named) -> list[TensorMeta]:
    """(name, tensor) pairs -> what planning needs of them (no torch import: the dtype's name only)."""
    return [TensorMeta(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]


def planned_dtype(meta: TensorMeta, engine_dtype: str | None, engine_tensors: dict | None = None) -> str:
    """The dtype a tensor travels in: the engine's for it (its contract's, else the serving dtype), cast on the
    trainer side while packing, but only between the float formats a cast keeps (float32, bfloat16, float16).
    Into or out of fp8 a cast is a quantization with a scale, which labkit.sync.quantize does or nothing does:
    the tensor keeps its dtype and the contract check refuses it by name (a bf16 tensor cast into an fp8 slot
    with the old scale served garbage and answered Success)."""
    if meta.dtype not in CASTABLE:
        return meta.dtype
    want = engine_tensors[meta.name][1] if engine_tensors and meta.name in engine_tensors else engine_dtype
    return want if want in CASTABLE else meta.dtype


CASTABLE = ("float32", "bfloat16", "float16", "float64")


def make_plan(metas: list[TensorMeta], cfg: SyncConfig, engine_dtype: str | None = None,
              engine_tensors: dict | None = None) -> Plan:
    """The plan a sync config asks for: per-tensor (one call each) or buckets within the memory budget, each
    tensor in its `planned_dtype`."""
    if engine_dtype or engine_tensors:
        metas = [TensorMeta(m.name, m.shape, planned_dtype(m, engine_dtype, engine_tensors)) for m in metas]
    if cfg.transport == "per-tensor":
        return plan_buckets(metas, 1, group=call_group)  # one tensor per call (the MLA pair: one), the baseline
    budget = int(cfg.memory_budget_mb * MB) if cfg.memory_budget_mb else None
    return plan_buckets(metas, cfg.bucket_bytes, budget_bytes=budget)
