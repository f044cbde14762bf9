"""The writing process's kept mappings of the rollback copies' `data.bin` files (labkit.sync.lastgood).

A fresh tmpfs file, or a fresh mapping of one, page-faults every page in at about half a memcpy; a mapping kept
across syncs is written at memory speed. Lives on the Syncer, so on whatever process runs the sync.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

MIN_BYTES = 64  # a mapping is never empty (lastgood.ALIGN: one aligned slot)


class Slots:
    """At most `KEEP` mappings: the last good copy and the one being written, which the store swaps. A mapping is
    reused only while its file is the same (inode) and large enough; a file the store removed is let go at the next
    `get` (its pages stay allocated while mapped). `close` lets go of them all."""

    KEEP = 2

    def __init__(self):
        self.files: dict[str, tuple[int, torch.Tensor]] = {}  # path -> (inode, whole mapping)

    def get(self, path: Path, nbytes: int) -> torch.Tensor:
        key, nbytes = str(path), max(nbytes, MIN_BYTES)
        for k in [k for k in self.files if k != key and not os.path.exists(k)]:
            del self.files[k]  # removed by the store (closed, or a slot given up): free its pages
        st = os.stat(key) if os.path.exists(key) else None
        held = self.files.get(key)
        if held is not None and st is not None and held[0] == st.st_ino and held[1].numel() >= nbytes \
                and st.st_size >= held[1].numel():
            return held[1]
        fd = os.open(key, os.O_RDWR | os.O_CREAT)
        try:
            size = max(nbytes, os.fstat(fd).st_size)
            os.ftruncate(fd, size)  # grows only
            ino = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self.files.pop(key, None)
        self.files[key] = (ino, torch.from_file(key, shared=True, size=size, dtype=torch.uint8))
        while len(self.files) > self.KEEP:
            del self.files[next(iter(self.files))]
        return self.files[key][1]

    def drop(self, path: Path) -> None:
        self.files.pop(str(path), None)

    def close(self) -> None:
        self.files.clear()
