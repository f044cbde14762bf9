"""The engine side of a colocated sync packed into the rollback copy: the bucket is read where the trainer
packed it, in the atomic guard's staging file (labkit.sync.lastgood), kept mapped across syncs.

Why: a guarded colocated sync packed into a shared bucket would copy every byte three times (pack into the
bucket, copy into the staging file for rollback, then the engine's copy into the parameters), two of them on the
trainer's core, the critical path of a CPU sync. Packed into the staging file, the bucket IS the rollback copy; the
engine reads it from there. The store recycles two staging files (the last good copy and the next), so after the first
two syncs the engine's mappings are warm: no page is faulted in again (a fresh mapping faults at ~3 GB/s, half a
memcpy).

The payload names the file and the offset of the bucket in it (`key`); the tensor it carries is a 1-byte
placeholder. Only files of labkit's stores are opened (`labkit_stage_*/<dir>/data.bin`): the name comes from
the trainer, and an engine maps nothing else. A mapping whose file the store removed is let go at the next
payload; the rest go with the engine's process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

PREFIX = "labkit-file/1:"  # PREFIX + json([path, offset]) + "\n" + the bucket's layout key (labkit.engine.inside.apply)
KEEP = 4  # files kept mapped (a store recycles two; a fan-out's or a restarted guard's are new ones)

_files: dict[str, tuple[int, torch.Tensor, dict]] = {}  # path -> (inode, whole mapping, views by (offset, key))


def key(path: str, offset: int, layout_key: str) -> str:
    return PREFIX + json.dumps([path, offset]) + "\n" + layout_key


def parse(name: str) -> tuple[str, int, str]:
    """(path, offset, layout key) of a file payload's name."""
    head, _, layout = name[len(PREFIX):].partition("\n")
    path, offset = json.loads(head)
    return path, int(offset), layout


def check_path(path: str) -> str:
    """The staging file's real path, refused unless it is one of labkit's rollback copies."""
    real = Path(os.path.realpath(path))
    if real.name != "data.bin" or not real.parent.parent.name.startswith("labkit_stage_") or not real.is_file():
        raise ValueError(f"labkit apply: {path!r} is not a labkit staging file (labkit_stage_*/<dir>/data.bin): "
                         f"an engine maps no other file a payload names")
    return str(real)


def views(path: str, offset: int, layout_key: str, entries: list) -> list[torch.Tensor]:
    """Typed views of each tensor of the bucket at `offset` in the staging file `path` ([name, dtype, shape,
    start, end] per entry, as in the layout key), built once per (file, offset, layout)."""
    path = check_path(path)
    whole, cache = _mapping(path)
    got = cache.get((offset, layout_key))
    if got is None:
        end = offset + max((e[4] for e in entries), default=0)
        if offset < 0 or end > whole.numel():
            raise ValueError(f"labkit apply: bucket [{offset}, {end}) is outside the staging file {path} "
                             f"({whole.numel()} bytes)")
        got = cache[(offset, layout_key)] = [whole[offset + a: offset + b].view(getattr(torch, d)).view(s)
                                             for _, d, s, a, b in entries]
    return got


def _mapping(path: str) -> tuple[torch.Tensor, dict]:
    for p in [p for p in _files if not os.path.exists(p)]:
        del _files[p]  # the store removed it: give its pages back
    st = os.stat(path)
    held = _files.get(path)
    if held is None or held[0] != st.st_ino or held[1].numel() != st.st_size:
        _files.pop(path, None)
        _files[path] = (st.st_ino, torch.from_file(path, shared=True, size=st.st_size, dtype=torch.uint8), {})
        while len(_files) > KEEP:
            del _files[next(iter(_files))]
    return _files[path][1], _files[path][2]
