"""The host-side copy of a weight version: what a failed sync restores the engine to, bitwise.

A copy is a directory: `data.bin` (every tensor's raw bytes, in the engine's dtype, 64-byte aligned) and `index.json`
(HF name, dtype, shape, offset per tensor + the version). `index.json` is written last, by rename, so a directory
without it is a copy that was cut short (its writer died) and is never read.

The syncer writes the copy of the version it sends while sending it (`Writer.add` per bucket), in whatever process runs
the sync, to a path the driver chose (tmpfs by default): the files outlive that process, so the copy survives a killed
trainer. `Store` (driver side) tracks the last good copy and recycles the superseded one as the next staging directory.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from labkit import pids
from labkit.engine.contract import Contract
from labkit.sync import bucket as bk
from labkit.sync.slots import Slots

ALIGN = 64
STAGE_PREFIX = "labkit_stage_"  # + `pids.owner_tag()` + "-": whose copies they are, for `Store`'s sweep


class Writer:
    """Writes one copy: tensors appended in order (`add`), then `finish` makes it a copy (index.json, by rename).

    With `maps` (a `Slots` of the writing process) the bytes are copied into a kept MAP_SHARED mapping of `data.bin`, so
    a directory the store recycles (`Store.staging`) is written at memory speed: a `write()` into tmpfs copies through
    the kernel even into pages that exist, and a fresh file or mapping page-faults every page in first. Nothing ever
    shrinks `data.bin` (a file shrunk under a mapping kills its writer with SIGBUS): bytes past `nbytes` are stale and
    never read."""

    def __init__(self, path: str | os.PathLike, maps: Slots | None = None, capacity: int = 0):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.maps, self.capacity = maps, capacity
        self._buf = maps.get(self.path / "data.bin", capacity) if maps is not None else None
        # O_RDWR without O_TRUNC: a recycled file may be mapped by the process that writes copies
        self._f = None if maps is not None else os.fdopen(os.open(self.path / "data.bin", os.O_RDWR | os.O_CREAT),
                                                          "r+b")
        self.entries: list[dict] = []
        self.nbytes = 0

    def add(self, named: dict[str, torch.Tensor]) -> None:
        for name, t in named.items():
            t = t.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8)
            self.nbytes += -self.nbytes % ALIGN
            self._put(raw)
            self.entries.append({"name": name, "dtype": bk.dtype_name(t.dtype), "shape": list(t.shape),
                                 "offset": self.nbytes, "nbytes": raw.numel()})
            self.nbytes += raw.numel()

    def region(self, nbytes: int) -> torch.Tensor:
        """The next `nbytes` of the mapped file (64-byte aligned), for a caller that packs a bucket straight into
        the copy (the colocated transport: the engine reads it from here, `locate`); `add_packed` then indexes it."""
        self.nbytes += -self.nbytes % ALIGN
        end = self.nbytes + nbytes
        view = self._upto(end)[self.nbytes:end]
        self.nbytes = end
        return view

    def locate(self, flat: torch.Tensor) -> tuple[str, int] | None:
        """(data.bin's path, byte offset) if `flat` is a view into this writer's mapping, else None."""
        buf = self._buf
        if buf is None or flat.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
            return None
        return str(self.path / "data.bin"), flat.storage_offset() - buf.storage_offset()

    def add_packed(self, layout: list[tuple[str, torch.dtype, tuple[int, ...], int]], flat: torch.Tensor) -> None:
        """Index tensors already packed into this copy by `region`: (name, dtype, shape, offset in `flat`) each."""
        base = self.locate(flat)[1]
        for name, dtype, shape, off in layout:
            nbytes = math.prod(shape) * dtype.itemsize
            self.entries.append({"name": name, "dtype": bk.dtype_name(dtype), "shape": list(shape),
                                 "offset": base + off, "nbytes": nbytes})

    def _put(self, raw: torch.Tensor) -> None:
        end = self.nbytes + raw.numel()
        if self._buf is None:
            self._f.seek(self.nbytes)
            self._f.write(memoryview(raw.numpy()))
            return
        self._upto(end)[self.nbytes:end].copy_(raw)

    def _upto(self, end: int) -> torch.Tensor:
        """The mapping, grown (file and map) when `end` is past it: more than the plan said, or no plan."""
        if end > self._buf.numel():
            self.capacity = max(end, 2 * self.capacity)
            self._buf = self.maps.get(self.path / "data.bin", self.capacity)
        return self._buf

    def finish(self, version: str) -> str:
        if self._f is not None:
            self._f.close()
        tmp = self.path / "index.json.tmp"
        tmp.write_text(json.dumps({"version": version, "nbytes": self.nbytes, "tensors": self.entries}))
        os.replace(tmp, self.path / "index.json")  # the copy exists from this instant on, whole
        return str(self.path)

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
        if self.maps is not None:
            self.maps.drop(self.path / "data.bin")
        shutil.rmtree(self.path, ignore_errors=True)


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / "index.json").is_file()


def load(path: str | os.PathLike) -> tuple[str, dict[str, torch.Tensor]]:
    """(version, {HF name: tensor}) of a complete copy."""
    path = Path(path)
    index = json.loads((path / "index.json").read_text())
    raw = torch.from_file(str(path / "data.bin"), shared=False, size=max(1, index["nbytes"]), dtype=torch.uint8)
    out = {e["name"]: raw[e["offset"]: e["offset"] + e["nbytes"]].view(bk.torch_dtype(e["dtype"])).reshape(e["shape"])
           for e in index["tensors"]}
    return index["version"], out


def extend(path: str | os.PathLike, named: dict[str, torch.Tensor]) -> None:
    """Append tensors to a complete copy; it stays complete (index.json replaced, by rename, last)."""
    if not named:
        return
    index = json.loads(Path(path, "index.json").read_text())
    w = Writer(path)  # appends after index["nbytes"]: bytes past it are stale (a recycled file) and overwritten
    w.entries, w.nbytes = index["tensors"], index["nbytes"]
    w.add(named)
    w.finish(index["version"])


def write(path: str | os.PathLike, named: dict[str, torch.Tensor], version: str) -> str:
    w = Writer(path)
    w.add(named)
    return w.finish(version)


def default_root() -> Path:
    """tmpfs where there is one (host memory, no disk I/O), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class Store:
    """Driver side: the last good copy (a complete directory, or a model dir's safetensors) and the staging
    directory of the sync in flight.

    With `spare` (the default) a superseded copy is kept as the next sync's staging directory (its index.json removed
    first, so it is never read as a copy again): the syncer's writer then copies into a mapping it already holds
    (`Slots`) instead of faulting a fresh model's worth of tmpfs pages in. Cost: two models of host memory at rest
    instead of one (two while a sync runs either way). `spare=False` frees the superseded copy at once."""

    def __init__(self, root: str | os.PathLike | None = None, spare: bool = True):
        root = Path(root or default_root())
        # Copies of this pid namespace's drivers that died unclosed (`pids.dead`: another container's copies stay)
        for d in pids.dead(root, STAGE_PREFIX):
            shutil.rmtree(d, ignore_errors=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{pids.owner_tag()}-", dir=root))
        self.good: dict | None = None  # {"path"|"model_dir", "version", "checksums"}
        self.spare: str | None = None  # a superseded copy's directory, no longer a copy, written over next
        self.keep_spare = spare
        self._n = 0
        atexit.register(self.close)  # tmpfs is memory: never leave a model's worth behind a driver that exits

    def staging(self, spare: bool | None = None) -> str:
        """A directory for the next copy: the spare (made incomplete first) or a new one. `spare` (the sync's
        `SyncConfig.stage_spare`) sets whether superseded copies are kept from now on; False removes the spare."""
        if spare is not None:
            self.keep_spare = spare
        path, self.spare = self.spare, None
        if path is not None and self.keep_spare and Path(path).is_dir():
            Path(path, "index.json").unlink(missing_ok=True)
            return path
        if path is not None:  # not kept (or gone)
            shutil.rmtree(path, ignore_errors=True)
        self._n += 1
        return str(self.root / f"s{self._n}")

    def promote(self, path: str, version: str, checksums: dict[str, str], dtype: str = "float32") -> None:
        """Make `path` the last good copy. A sync that left tensors out (`exclude=`) wrote only what it sent;
        the engine still serves the left-out ones as they were, so they are carried over from the previous
        good copy: the last good copy is always the whole model (else a later failed sync could not restore)."""
        old = self.good
        if old is not None and old.get("path") != path:
            missing = _names(old) - _names({"path": path})
            if missing:  # read the previous copy only when there is something to carry
                extend(path, {n: t for n, t in self.tensors(dtype).items() if n in missing})
        self.good = {"path": path, "version": version, "checksums": dict(checksums)}
        if old and old.get("path") and old["path"] != path:
            self._retire(old["path"])

    def adopt_model_dir(self, model_dir: str, version: str, checksums: dict[str, str]) -> None:
        old = self.good
        self.good = {"model_dir": model_dir, "version": version, "checksums": dict(checksums)}
        if old and old.get("path"):
            self._retire(old["path"])

    def discard(self, path: str | None) -> None:
        if path and (not self.good or self.good.get("path") != path):
            self._retire(path)

    def _retire(self, path: str) -> None:
        """A directory that is no longer the last good copy: the spare, or removed."""
        Path(path, "index.json").unlink(missing_ok=True)  # never a copy again, whatever happens next
        if self.keep_spare and self.spare is None:
            self.spare = path
        elif path != self.spare:
            shutil.rmtree(path, ignore_errors=True)

    def tensors(self, dtype: str) -> dict[str, torch.Tensor]:
        """The last good weights by HF name, in the engine's dtype."""
        if self.good is None:
            raise RuntimeError("no last good weights recorded")
        if "path" in self.good:
            return load(self.good["path"])[1]
        return model_dir_tensors(self.good["model_dir"], dtype)

    def close(self) -> None:
        self.spare = None
        shutil.rmtree(self.root, ignore_errors=True)


def _names(good: dict) -> set[str]:
    if "path" in good:
        return {e["name"] for e in json.loads((Path(good["path"]) / "index.json").read_text())["tensors"]}
    out = set()
    for f in Path(good["model_dir"]).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            out.update(st.keys())
    return out


def model_dir_tensors(model_dir: str, dtype: str) -> dict[str, torch.Tensor]:
    """A model directory's safetensors as the engine holds them (labkit.engine.contract): floating tensors in the
    engine's serving dtype, a block-FP8 checkpoint's fp8 weights and float32 scales as they are."""
    held = (Contract.find(model_dir, dtype) or Contract.from_model_dir(model_dir, dtype)).tensors
    out = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        for n, t in load_file(str(f)).items():
            out[n] = t.to(bk.torch_dtype(held[n][1])) if t.is_floating_point() else t
    return out
