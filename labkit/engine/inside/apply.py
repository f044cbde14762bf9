"""The engine side of a colocated sync: receive buffers mapped once per sync, a copy plan, no `load_weights`.

Runs inside SGLang's scheduler as a custom weight loader: SGLang 0.5.23 calls
`dynamic_import(load_format)(model, named_tensors)` when `load_format` was listed in the server argument
`custom_weight_loader` (`model_runner_components/weight_updater.py`), between begin/end_weight_update like every
other format; labkit's engines list `FORMAT` at launch (labkit.engine.config).

Why not SGLang's `flattened_bucket` format, which moves the same bytes:
- it maps the shared-memory segment afresh on every call: torch keeps a received segment only while something
  holds it (`torch/multiprocessing/reductions.py`, `shared_cache` of weak refs), the scheduler drops the
  tensors after loading, so each sync page-faults every bucket in again;
- it hands the views to `model.load_weights`, a Python loop with name matching per tensor (`labkit bench sync`
  times that path as its peer arm).

Here a received buffer stays mapped (at most `KEEP`: the trainer double-buffers, so 11 buckets map 2 buffers, not
11 segments) for as long as the trainer keeps sending it: the trainer's closing read (`end_sync`) releases only
the buffers that sync did not use (a pool the trainer replaced), so the next sync's handles resolve to mappings
that are already faulted in (a fresh mapping faults at ~3 GB/s, about half a memcpy). Between syncs an engine
thus holds the trainer's two buffers; a SIGKILLed engine never gives its reference back (torch counts them in the
file), so those files outlive both processes until `labkit.compat.sglang.cleanup_shm` finds nobody maps them (the
driver runs it when a trainer or engine is gone). Each bucket layout is compiled once into a copy plan
(labkit.engine.inside.copyplan: the destination slice of each tensor, from the model's `param_view(hf_name)`, the view
`get_weights_by_name` reads back, and the tensors merged into a few strided copies), the source views into a
kept buffer are built once, and a bucket then costs one `torch._foreach_copy_` of a few views (plus a check, by
name, that no destination parameter was re-created since).

Per call SGLang itself walks every module of the model first (a startup-constant check); labkit asks it once per
model (`_memo_derived_weight_check`).

Falls back to the model's own `load_weights` for the tensors it cannot map: a model without `param_view`, a
name the model does not map. At TP > 1 each rank copies its own piece of each tensor
(labkit.engine.inside.shardview). `end_sync()` counts the tensors each path applied (the trainer reports them
as `sync/apply_path`).

Delta payloads (`DELTA_PREFIX`, labkit.engine.inside.delta) carry only the words that changed since the last sync; they
go through the same plan into the same parameter slices, and need every tensor of the bucket in it.

Under the atomic guard the colocated bucket is not in a shared segment at all: the trainer packs it into the
guard's staging file and the payload names the file and offset (`labkit.engine.inside.colocated`, kept mapped across
syncs); the plan and the copy are the same.

The same entry point takes the distributed path: SGLang receives the broadcast bucket as one uint8 tensor named
by its layout and hands it to the model's `load_weights`, which labkit's models route here (`routes`).
"""

from __future__ import annotations

import json
import sys
import weakref
from collections import OrderedDict

import torch

from labkit import failpoints as fp
from labkit.cluster import shm_manager
from labkit.engine.inside import checkmemo
from labkit.engine.inside import copyplan
from labkit.engine.inside import delta
from labkit.engine.inside import direct
from labkit.engine.inside import ring
from labkit.engine.inside import runners
from labkit.engine.inside import colocated as stagefile
from labkit.engine.config import APPLY_FORMAT

FORMAT = APPLY_FORMAT  # the import path SGLang resolves: this module's `load_flat` (unit-tested)
PREFIX = "labkit-flat/1:"  # the single named tensor's name: PREFIX + the bucket's layout as JSON
DELTA_PREFIX = "labkit-delta/1:"  # DELTA_PREFIX + "<word bytes>:<words>:<encoding>:" + the layout key
KEEP = 4  # received buffers kept mapped (the trainer's pool holds 2; a new bucket size brings new ones)
STATS_NAME = "labkit.apply/end_sync"  # get_weights_by_name(STATS_NAME) -> [[copied, via load_weights]]: end_sync


def layout_key(entries: list[tuple[str, str, tuple[int, ...], int, int]]) -> str:
    """The bucket's layout, `(hf_name, dtype, shape, start_byte, end_byte)` per tensor, as the payload's name."""
    return PREFIX + json.dumps([[n, d, list(s), a, b] for n, d, s, a, b in entries], separators=(",", ":"))


def delta_key(layout: str, word: int, n_words: int, encoding: str = "mask") -> str:
    """A delta payload's name: the bucket's layout key plus the codec's word size, word count and encoding."""
    return f"{DELTA_PREFIX}{word}:{n_words}:{encoding}:{layout}"


def layout_of(key: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of each tensor a labkit payload name carries (full or delta)."""
    if key.startswith(DELTA_PREFIX):
        key = key[len(DELTA_PREFIX):].split(":", 3)[3]
    return [(n, tuple(shape)) for n, _, shape, _, _ in json.loads(key[len(PREFIX):])]


def routes(weights) -> bool:
    """Whether a `load_weights` call carries labkit payloads (the distributed path: labkit's models send
    those here)."""
    return bool(weights) and isinstance(weights[0][0], str) and weights[0][0].startswith((PREFIX, DELTA_PREFIX))


_stats = {"copy_plan": 0, "load_weights": 0}  # tensors applied by each path since the last `end_sync`
_mapped: OrderedDict[int, tuple[torch.Tensor, dict[str, list[torch.Tensor]]]] = OrderedDict()
_used: set[int] = set()  # kept buffers a bucket arrived in since the last `end_sync`


def load_flat(model, named_tensors) -> None:
    """SGLang's custom-loader entry point: `named_tensors` is `[(layout_key, flat uint8 buffer)]`."""
    _memo_derived_weight_check()
    if named_tensors and isinstance(named_tensors[0][0], str) and named_tensors[0][0].startswith(ring.PREFIX):
        from sglang.srt.utils import MultiprocessingSerializer  # SGLang is crossed here only (its own unpickler)

        # The call's placeholder is the trainer's shared segment: dropped once the call returns after a killed
        # trainer, it would take the engine down (`_release`). It is let go when the trainer closes the sync
        # (`end_sync`) or at the next ring sync (no local name may hold it: this frame outlives a killed trainer).
        if runners.served(named_tensors[0][0], model):  # a draft runner: the target's call applied every bucket
            return
        while _placeholders:
            _release(_placeholders.pop())
        _placeholders.append(named_tensors[0][1])
        runners.serve_ring(named_tensors[0][0], model, MultiprocessingSerializer.deserialize, load_flat)
        return  # the whole sync, in this one call
    for key, flat in named_tensors:
        if isinstance(key, str) and key.startswith(direct.DONE_PREFIX):  # the trainer wrote the parameters itself
            _after_apply(model, direct.written(key))
            checkmemo.MEMO.release()  # its writes are done: checksums may be remembered again
            continue
        if isinstance(key, str) and key.startswith(DELTA_PREFIX):
            _apply_delta(model, key, flat)
            continue
        path = offset = None
        if isinstance(key, str) and key.startswith(stagefile.PREFIX):  # packed into the guard's staging file
            path, offset, key = stagefile.parse(key)
        elif not isinstance(key, str) or not key.startswith(PREFIX):
            raise ValueError(f"labkit apply: payload name {str(key)[:60]!r} is not a labkit flat bucket "
                             f"(expected {PREFIX!r}, {DELTA_PREFIX!r} or {stagefile.PREFIX!r} + layout)")
        plan = copyplan.plan_for(model, key)
        srcs = _sources(flat, key, plan) if path is None else stagefile.views(path, offset, key, plan.entries)
        if fp.engine_armed("engine.apply"):  # `labkit faults`: a failure in the middle of an apply
            _copy_runs_one_by_one(plan, copyplan.narrowed(plan, srcs))
        elif plan.dsts:  # a few strided copies, not one per tensor (labkit.engine.inside.copyruns)
            torch._foreach_copy_(plan.run_dsts, copyplan.run_sources(plan, copyplan.narrowed(plan, srcs)))
        if plan.fallback:
            model.load_weights([(plan.entries[i][0], srcs[i]) for i in plan.fallback])
        _after_apply(model, [plan.entries[i][0] for i in plan.direct])
        _stats["copy_plan"] += len(plan.direct) + len(plan.elsewhere)
        _stats["load_weights"] += len(plan.fallback)
        settle(flat)


def _copy_runs_one_by_one(plan: copyplan.CopyPlan, srcs: list[torch.Tensor]) -> None:
    """The plan's own merged copies, issued one run at a time with the armed failpoint hit before each of the
    run's tensors: a fault lands between two of the copies a normal sync makes, never on a path it never takes."""
    for run, dst, src in zip(plan.runs, plan.run_dsts, copyplan.run_sources(plan, srcs)):
        for m in run.members:
            fp.hit("engine.apply", name=plan.entries[plan.direct[m]][0])
        torch._foreach_copy_([dst], [src])


def _after_apply(model, names: list[str]) -> None:
    """A model whose forward reads copies derived at load (DeepSeek's w_kc/w_vc from kv_b_proj) re-derives them
    from what the plan copied (`labkit_after_apply`); SGLang's own `load_weights` does that itself."""
    after = getattr(model, "labkit_after_apply", None)
    if after is None or not names:
        return
    if fp.engine_armed("engine.derive") and fp.hit("engine.derive"):  # `skip`: the derived copies stay stale
        return
    after(names)


def _apply_delta(model, key: str, payload: torch.Tensor) -> None:
    """Write the changed words of a delta payload into the parameter slices of its bucket's plan."""
    word, n_words, encoding, layout = key[len(DELTA_PREFIX):].split(":", 3)
    plan = copyplan.plan_for(model, layout)
    loose = [plan.entries[i][0] for i in [*plan.fallback, *plan.pieces]] + \
        [plan.entries[i][0] for i, d in zip(plan.direct, plan.dsts) if not d.is_contiguous()]
    if loose:
        raise ValueError(f"labkit apply: a delta sync needs every tensor of a bucket in the copy plan, and "
                         f"{loose[:3]} ({len(loose)}) are not plain contiguous slices of this model's parameters; "
                         f"sync with SyncConfig.delta=0")
    if fp.engine_armed("engine.apply"):  # `labkit faults`: a failure before this bucket's changed words land
        for e in plan.entries:
            fp.hit("engine.apply", name=e[0])
    if not plan.direct:  # a bucket this runner holds nothing of (a speculative engine's draft: the trunk)
        return
    spans = [tuple(plan.entries[i][3:5]) for i in plan.direct]  # `elsewhere`: held by another runner or rank
    delta.decode_into(_held(payload), int(word), int(n_words), spans, plan.dsts, encoding)
    _after_apply(model, [plan.entries[i][0] for i in plan.direct])
    _stats["copy_plan"] += len(plan.direct)
    settle(payload)


SETTLE = True  # `labkit bench device`'s hazard probe turns it off in its engine to count what that costs


def settle(flat: torch.Tensor) -> None:
    """Wait for this bucket's copies before the call returns. On a GPU the copies are queued on the engine's
    stream and the call would return (and the trainer hear "loaded") before they ran; the trainer then packs
    bucket i + 2 into the same buffer (the pool holds two; a delta payload pool one) while the engine may still
    be reading it, and parameters end up holding the next bucket's bytes. CPU copies are done when they
    return. `labkit bench device` counts the parameters so corrupted with and without this wait."""
    if SETTLE and flat.is_cuda:
        torch.cuda.current_stream(flat.device).synchronize()


def end_sync() -> list[int]:
    """Release the kept buffers this sync did not use; return [tensors copied by plan, tensors through
    load_weights] since the last call. The trainer calls it once at the end of each sync through the model's
    get_weights_by_name(STATS_NAME), the one reply channel into a scheduler SGLang offers."""
    for ptr in [p for p in _mapped if p not in _used]:  # a buffer this sync did not use: the trainer replaced it
        _release(_mapped.pop(ptr)[0])
    while _placeholders:  # the ring call's placeholder: its trainer is alive (it asks), so it can go now
        _release(_placeholders.pop())
    _used.clear()
    out = [_stats["copy_plan"], _stats["load_weights"]]
    _stats.update(copy_plan=0, load_weights=0)
    return out


def _sources(flat: torch.Tensor, key: str, plan: copyplan.CopyPlan) -> list[torch.Tensor]:
    """Views of each tensor in `flat`, built once per (kept buffer, layout). Keeping `flat` keeps its segment
    mapped, so the next bucket's handle to the same buffer resolves to this mapping (no fresh mmap)."""
    held = _keep(flat)
    views = held[1].get(key)
    if views is None:
        base = held[0].untyped_storage()
        off = flat.storage_offset()  # the whole segment: a later bucket in this buffer may be larger
        # On the buffer's device: a CPU tensor pointed at a CUDA storage raises "Attempted to set the storage of a
        # tensor on device cpu to a storage on different device cuda:0" (tests/unit/test_gpu_path_on_cpu.py: meta).
        buf = torch.empty(0, dtype=torch.uint8, device=flat.device).set_(base, off, (base.nbytes() - off,))
        views = held[1][key] = [buf[a:b].view(getattr(torch, d)).view(s) for _, d, s, a, b in plan.entries]
    return views


def _keep(flat: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The kept (buffer, views by layout) entry for `flat`'s segment; a buffer not in shared memory (the
    distributed path receives into a fresh tensor each bucket) is not kept."""
    if not flat.is_shared():
        return flat, {}
    ptr = flat.data_ptr()
    held = _mapped.get(ptr)
    if held is None or held[0].untyped_storage().nbytes() != flat.untyped_storage().nbytes():
        held = _mapped[ptr] = (flat, {})
        while len(_mapped) > KEEP:
            _release(_mapped.popitem(last=False)[1][0])
    _mapped.move_to_end(ptr)
    _used.add(ptr)
    return held


def _held(payload: torch.Tensor) -> torch.Tensor:
    """`payload`, with its segment kept mapped for the rest of the sync (no fresh mmap for the next bucket)."""
    _keep(payload)
    return payload


def _memo_derived_weight_check() -> None:
    """SGLang 0.5.23 walks every module of the model (`_unsupported_derived_weight_cache_error`, getattr x5 per
    module) at the top of every `update_weights_from_tensor`, a walk that on a small model costs as much as
    the bucket's copy. Its own docstring says the answer
    is "startup-determined and rank-uniform", so it is computed once per model here and reused. Pinned to the
    version it was read in; any other leaves SGLang's function alone."""
    global _memo_done
    if _memo_done:
        return
    _memo_done = True
    if "sglang" not in sys.modules:  # not inside SGLang's scheduler (labkit bench device's stand-in): nothing to memo
        return
    import sglang  # SGLang is crossed here only (inside its scheduler)
    from sglang.srt.model_executor.model_runner_components import weight_updater as wu

    original = getattr(wu, "_unsupported_derived_weight_cache_error", None)
    if sglang.__version__ != "0.5.23" or original is None:
        return
    answers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def memo(model=None):
        if model is None:
            return original(model)
        if model not in answers:
            answers[model] = original(model)
        return answers[model]

    wu._unsupported_derived_weight_cache_error = memo


_memo_done = False


def _release(flat: torch.Tensor) -> None:
    """Let go of a kept buffer, unless the torch_shm_manager it is filed under is gone: freeing a `file_system`-shared
    segment tells that manager, and with the manager dead torch aborts the whole process (`terminate ...
    std::system_error: Broken pipe`, seen when a trainer that ran its own manager was killed mid-sync and the engine
    then dropped the bucket it had kept: Ray kills a worker's children with it). Such a buffer is kept for good
    instead. A trainer that joined the run's manager (labkit.cluster.shm_manager) leaves a manager that lives on,
    so its buffers are freed like any other."""
    try:
        handle = flat.untyped_storage()._share_filename_cpu_()[0]
    except (RuntimeError, ValueError, AttributeError):
        return  # not a file_system segment (CUDA, fd strategy): an ordinary free
    if not shm_manager.alive(handle):
        _orphans.append(flat)


_orphans: list[torch.Tensor] = []
_placeholders: list[torch.Tensor] = []  # the last ring call's placeholder tensor (`load_flat`)
