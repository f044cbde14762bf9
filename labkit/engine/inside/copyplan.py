"""A bucket layout compiled against the engine's parameters: where each tensor goes, and the copies that put it
there (labkit.engine.inside.apply runs them inside SGLang's scheduler).

Compiled once per layout (the same every sync of a replayed plan): the destination slice of each tensor from
the model's `param_view(hf_name)` (the view `get_weights_by_name` reads back; at TP > 1 the rank's piece of it,
labkit.engine.inside.shardview), the tensors the model must load itself (`fallback`: no `param_view`, a shape
the view does not have; a dtype it does not have is refused, never cast), and the copies of the rest merged
into a few strided ones (labkit.engine.inside.copyruns: an MoE bucket's hundreds of expert tensors become a
handful of copies). A parameter re-created since (a
post-load repack, a memory resume) makes the plan compile again (`moved`), so no copy lands in orphaned storage.
"""

from __future__ import annotations

import json
import math
import sys
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from labkit.engine.contract import ContractMismatch
from labkit.engine.inside import copyruns
from labkit.engine.inside import shardview


@dataclass
class CopyPlan:
    """How one bucket layout lands in the model's parameters, compiled once per layout (not the sync's bucket plan,
    labkit.sync.plan.Plan)."""

    entries: list  # [name, dtype, shape, start, end] per tensor
    dsts: list[torch.Tensor] = field(default_factory=list)  # parameter slices, for entries[direct[i]]
    direct: list[int] = field(default_factory=list)
    owners: list[tuple] = field(default_factory=list)  # (module, attribute, data_ptr at compile) per parameter
    fallback: list[int] = field(default_factory=list)  # through model.load_weights
    pieces: dict[int, tuple] = field(default_factory=dict)  # entry -> (dim, start, length) this rank takes (TP > 1)
    elsewhere: list[int] = field(default_factory=list)  # entries this rank holds only padding of (TP > 1)
    runs: list[copyruns.Run] = field(default_factory=list)  # the copies of `direct` (members: positions in it)
    run_dsts: list[torch.Tensor] = field(default_factory=list)  # each run's destination view


# On a GPU, merge only pieces below this size. torch's multi-tensor copy of contiguous tensors ran at 1,097 GB/s
# on an H100 for one Qwen3-30B-A3B expert layer (384 tensors of 3 MiB) against 822 GB/s as two strided copies;
# for 1,536 tensors of 128 KiB it ran at 262 GB/s against 772 (data/copyruns_h100_*.json, scripts/copyruns_bench.py).
GPU_MERGE_BELOW = 1 << 20
# (id(model), key) -> (the model, its plan), least recently used first. One sync replays one plan's buckets, each a
# layout, so the table holds whole plans (a large model in 512 MiB buckets has hundreds): a table smaller than the
# plan compiles every bucket of every sync again (`labkit bench device` shows it as a low apply rate on warm
# syncs; docs/gpu.md). A plan is views and indices, no tensor memory.
MAX_PLANS = 1 << 14
_plans: OrderedDict[tuple[int, str], tuple[weakref.ref, CopyPlan]] = OrderedDict()


def plan_for(model, key: str) -> CopyPlan:
    """`model`'s compiled plan of layout `key` (a labkit layout key: a prefix, then the layout as JSON). Kept per
    model: a scheduler may hold two models that take the same names (a speculative draft beside its target)."""
    held = _plans.get((id(model), key))
    if held is None or held[0]() is not model or moved(model, held[1]):
        return _compile(model, key)
    _plans.move_to_end((id(model), key))
    return held[1]


def narrowed(plan: CopyPlan, srcs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The bucket's tensor views (by entry) cut to the piece this rank takes (TP > 1; at TP 1 `srcs` itself)."""
    if not plan.pieces:
        return srcs
    return [s.narrow(*plan.pieces[i]) if i in plan.pieces else s for i, s in enumerate(srcs)]


def run_sources(plan: CopyPlan, srcs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each run's source view into the bucket, from the views of its tensors (`srcs`, by entry): a few strided
    views per bucket, built per call (cheap) so that none outlives the buffer it reads."""
    out = []
    for run in plan.runs:
        first = srcs[plan.direct[run.members[0]]]
        if len(run.members) == 1:
            out.append(first)
        else:
            size, stride, _ = copyruns.views(run)
            out.append(first.as_strided(size, stride, first.storage_offset()))
    return out


def moved(model, plan: CopyPlan) -> bool:
    """A parameter re-created since the plan was compiled (a post-load repack, a memory resume) would leave
    the plan copying into orphaned storage: re-resolve each owner by name, compare its storage."""
    return any(getattr(module, attr).data_ptr() != ptr for module, attr, ptr in plan.owners)


def tp_rank() -> tuple[int, int]:
    """(tensor-parallel size, this rank), from SGLang's runtime context ((1, 0) outside an engine: nothing published).
    Only that case is caught: SGLang 0.5.23 keeps `get_tensor_model_parallel_world_size` out of
    `sglang.srt.distributed`'s exports, and a swallowed ImportError read every engine as TP=1, so a TP=2 engine
    compiled TP=1 views and both schedulers died in the first apply (`start (128) + length (128) exceeds
    dimension size (128)`). Without SGLang in the process (the torch-only data path `labkit bench device` runs on a
    GPU machine that has no SGLang) there is no engine either: one rank."""
    if "sglang" not in sys.modules:
        return 1, 0
    from sglang.srt.runtime_context import get_parallel  # SGLang is crossed here only

    try:
        return int(get_parallel().tp_size), int(get_parallel().tp_rank)
    except ValueError:  # "config namespace 'parallel' not published": not inside an engine
        return 1, 0


def _compile(model, key: str) -> CopyPlan:
    plan = CopyPlan(json.loads(key[key.index("["):]))
    tp, rank = tp_rank()
    views = hasattr(model, "param_view")
    for i, (name, dtype, shape, _, _) in enumerate(plan.entries):
        found = shardview.view(model, name, tuple(shape), tp, rank) if views else None
        if found is not None and found[1] is shardview.NOTHING:  # this rank holds only padding of it
            plan.elsewhere.append(i)
            continue
        dst, piece = (None, None) if found is None else found[1:]
        if piece is not None:  # the shape of the rank's piece of the tensor
            shape = [*shape[:piece[0]], piece[2], *shape[piece[0] + 1:]]
        if dst is not None and tuple(dst.shape) == tuple(shape) and str(dst.dtype) != f"torch.{dtype}":
            raise ContractMismatch(_cast_refused(name, dtype, dst.dtype))
        if dst is None or tuple(dst.shape) != tuple(shape):
            plan.fallback.append(i)  # the model's own loader: casts, shards, or refuses with its message
            continue
        plan.direct.append(i)
        plan.dsts.append(dst)
        if piece is not None:
            plan.pieces[i] = piece
        path, _, attr = found[0].rpartition(".")
        module = model.get_submodule(path)
        plan.owners.append((module, attr, getattr(module, attr).data_ptr()))
    segments = [_segment(plan.entries[i], d, i in plan.pieces) for i, d in zip(plan.direct, plan.dsts)]
    plan.runs = copyruns.runs(segments)
    if plan.dsts and plan.dsts[0].is_cuda:  # large pieces: the multi-tensor copy is faster there (GPU_MERGE_BELOW)
        plan.runs = [r for run in plan.runs for r in (copyruns.apart(run) if run.count > 1 and
                     math.prod(run.shape) * plan.dsts[0].element_size() >= GPU_MERGE_BELOW else [run])]
    plan.run_dsts = [_run_dst(run, plan.dsts[run.members[0]]) for run in plan.runs]
    _plans[(id(model), key)] = (weakref.ref(model), plan)
    _plans.move_to_end((id(model), key))
    while len(_plans) > MAX_PLANS:  # layouts change with the bucket size: the oldest go first
        _plans.popitem(last=False)
    return plan


def _cast_refused(name: str, sent: str, held: torch.dtype) -> str:
    """A tensor of one dtype for a parameter of another is refused before this bucket writes anything: SGLang's
    fused and row-parallel loaders would cast it with a plain `copy_` (`layers/parameter.py:224/274/318`), and
    into an fp8 parameter that cast keeps the old block scale (a bf16 export served as garbage, reported
    Success). A cast the sender wants is the sender's (labkit.sync.plan.planned_dtype); a quantization is
    labkit.sync.quantize's."""
    return (f"{name!r}: dtype {sent} sent for an engine parameter of dtype {str(held).removeprefix('torch.')}; "
            "refused before this bucket wrote anything (a cast here would be silent; an fp8 one would keep the "
            "old scale)")


def _segment(entry: list, dst: torch.Tensor, piece: bool = False) -> copyruns.Segment:
    """A piece of a tensor (TP > 1) is not a run of the bucket's bytes: never merged (start None)."""
    start, size = entry[3], dst.element_size()
    first = start // size if start % size == 0 and not piece else None
    return copyruns.Segment(first, dst.untyped_storage().data_ptr(), dst.storage_offset(), tuple(dst.shape),
                            tuple(dst.stride()), entry[1])


def _run_dst(run: copyruns.Run, first: torch.Tensor) -> torch.Tensor:
    if len(run.members) == 1:
        return first
    size, _, stride = copyruns.views(run)
    return first.as_strided(size, stride, first.storage_offset())
