"""A bucket's copy plan as a few strided copies: tensors that sit at a constant step in the bucket and at a
constant step in one parameter are copied as one.

Why: an MoE bucket holds hundreds of expert tensors (gate, up, down per expert, ~72 KB each in the qwen3-moe
preset); as one `torch._foreach_copy_` of hundreds of small copies they are, on CPU, a loop of single-threaded
copies. Expert e's gate and up are the two row blocks of `w13_weight[e]` and sit back to back in the bucket, so
they merge into one flat copy; expert e+1's then sits one expert further in both the bucket and `w13_weight`, so
the layer's gate/up copies form one progression, and its down copies (`w2_weight[e]`) another. A progression is
one copy of a strided view on each side, which torch splits over its threads (`scripts/copyruns_bench.py` times
both ways; data/copyruns_h100_*.json holds its GPU runs). The same rule finds nothing to merge in a dense model's bucket
(q/k/v and gate/up differ in shape and fall back to one copy each): nothing changes there.

Pure: the plan is computed from offsets, shapes and strides (`Segment`), never from tensors;
`labkit.engine.inside.apply` builds the views. A merge is exact by construction: a progression's j-th member
reads and writes exactly the elements its own copy would, and members never overlap on the destination side (checked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """One tensor's copy: source offset in elements of its dtype (None: not aligned to it, never merged), and its
    destination in a parameter's storage."""
    src: int | None
    storage: int  # the destination parameter's storage (any identity: equal for tensors of one parameter)
    dst: int  # the destination's storage offset, in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # the destination's strides
    dtype: str


@dataclass
class Run:
    """`count` pieces copied as one (`members`: the segments they hold, in order): each piece of `shape`, with
    destination strides `stride` (contiguous on the source side), pieces `src_step` source elements and
    `dst_step` destination elements apart. A piece is one segment, or neighbours joined into one flat block."""
    members: list[int]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    count: int = 1
    src_step: int = 0
    dst_step: int = 0


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def extent(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a view's first element to one past its last (0 for an empty view)."""
    return 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(shape) else 0


def runs(segments: list[Segment]) -> list[Run]:
    """Copies that do what one copy per segment does. The segments of a valid plan write disjoint elements, so
    the order of the copies does not matter; a run's own members are disjoint by construction."""
    return _progressions(_concatenated(segments), segments)


def _concatenated(segments: list[Segment]) -> list[Run]:
    """Neighbours that continue each other on both sides (contiguous, one parameter) become one flat piece."""
    out: list[Run] = []
    end: tuple | None = None  # (storage, dtype, source end, destination end) of the last piece, if it can grow
    for i, s in enumerate(segments):
        n = math.prod(s.shape)
        flat = s.src is not None and n > 0 and s.stride == contiguous_strides(s.shape)
        if flat and end == (s.storage, s.dtype, s.src, s.dst):
            out[-1].members.append(i)
            out[-1].shape = (out[-1].shape[0] + n,)
        else:
            out.append(Run([i], (n,) if flat else s.shape, (1,) if flat else s.stride))
        end = (s.storage, s.dtype, s.src + n, s.dst + n) if flat else None
    return out


def _progressions(pieces: list[Run], segments: list[Segment]) -> list[Run]:
    """Pieces of one shape in one parameter, at constant steps on both sides, become one strided copy. Pieces of
    one kind may interleave (a padded expert's gate and up are two row blocks apart, so they do not join into one
    piece and alternate in the bucket): a parameter's pieces are split into `k` interleaved progressions, the
    smallest `k` up to `MAX_INTERLEAVE` that works, else greedily."""
    out: list[Run] = []
    by_key: dict[tuple, list[Run]] = {}
    for p in pieces:
        seg = segments[p.members[0]]
        if seg.src is None or not all(p.shape):
            out.append(p)
        else:
            by_key.setdefault((seg.storage, seg.dtype, p.shape, p.stride), []).append(p)
    for seq in by_key.values():
        out.extend(_split(seq, segments))
    return sorted(out, key=lambda r: r.members[0])


MAX_INTERLEAVE = 4


def _split(seq: list[Run], segments: list[Segment]) -> list[Run]:
    for k in range(1, min(len(seq), MAX_INTERLEAVE) + 1):
        classes = [seq[r::k] for r in range(k)]
        steps = [_steps(c, segments) for c in classes]
        if all(st is not None for st in steps):
            return [_joined(c, st) for c, st in zip(classes, steps)]
    stretches: list[list[Run]] = []  # no regular interleave: consecutive stretches that are progressions
    for p in seq:
        if stretches and _steps(stretches[-1] + [p], segments) is not None:
            stretches[-1].append(p)
        else:
            stretches.append([p])
    return [_joined(s, _steps(s, segments)) for s in stretches]


def _steps(seq: list[Run], segments: list[Segment]) -> tuple[int, int] | None:
    """(source step, destination step) if `seq` is a progression, forward on both sides with no overlap."""
    if len(seq) == 1:
        return 0, 0
    first = [segments[p.members[0]] for p in seq]
    ds, dd = first[1].src - first[0].src, first[1].dst - first[0].dst
    if ds < math.prod(seq[0].shape) or dd < extent(seq[0].shape, seq[0].stride):
        return None
    ok = all(f.src == first[0].src + j * ds and f.dst == first[0].dst + j * dd for j, f in enumerate(first))
    return (ds, dd) if ok else None


def _joined(seq: list[Run], steps: tuple[int, int]) -> Run:
    if len(seq) == 1:
        return seq[0]
    return Run([m for p in seq for m in p.members], seq[0].shape, seq[0].stride, len(seq), *steps)


def apart(run: Run) -> list[Run]:
    """A progression's pieces as one copy each again (a piece that joined neighbours stays one flat copy)."""
    k = len(run.members) // run.count
    return [Run(run.members[j * k:(j + 1) * k], run.shape, run.stride) for j in range(run.count)]


def views(run: Run) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(size, source strides, destination strides) of the run's strided views, each anchored at its first
    segment's offsets (`as_strided(size, strides, storage_offset)`); a run of one piece keeps its own shape."""
    if run.count == 1:
        return run.shape, contiguous_strides(run.shape), run.stride
    return ((run.count, *run.shape), (run.src_step, *contiguous_strides(run.shape)),
            (run.dst_step, *run.stride))
