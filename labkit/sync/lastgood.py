"""The host-side copy of a weight version: what a failed sync restores the engine to, bitwise.

A copy is a directory: `data.bin` (every tensor's raw bytes, in the engine's dtype, 64-byte aligned) and
`index.json` (HF name, dtype, shape, offset per tensor + the version). `index.json` is written last, by
rename, so a directory without it is a copy that was cut short (its writer died) and is never read.

The syncer writes the copy of the version it is sending while it sends it (`Writer.add` per bucket), in
whatever process runs the sync, to a path the driver chose (tmpfs by default): the files outlive that
process, so the copy survives the trainer being killed. `Store` (driver side) keeps which copy is the last
good one and removes the others.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from labkit.sync import bucket as bk

ALIGN = 64


class Writer:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path / "data.bin", "wb")
        self.entries: list[dict] = []
        self.nbytes = 0

    def add(self, named: dict[str, torch.Tensor]) -> None:
        for name, t in named.items():
            t = t.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8)
            pad = -self.nbytes % ALIGN
            if pad:
                self._f.write(b"\0" * pad)
                self.nbytes += pad
            self._f.write(memoryview(raw.numpy()))
            self.entries.append({"name": name, "dtype": bk.dtype_name(t.dtype), "shape": list(t.shape),
                                 "offset": self.nbytes, "nbytes": raw.numel()})
            self.nbytes += raw.numel()

    def finish(self, version: str) -> str:
        self._f.close()
        tmp = self.path / "index.json.tmp"
        tmp.write_text(json.dumps({"version": version, "nbytes": self.nbytes, "tensors": self.entries}))
        os.replace(tmp, self.path / "index.json")  # the copy exists from this instant on, whole
        return str(self.path)

    def abort(self) -> None:
        self._f.close()
        shutil.rmtree(self.path, ignore_errors=True)


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / "index.json").is_file()


def load(path: str | os.PathLike) -> tuple[str, dict[str, torch.Tensor]]:
    """(version, {HF name: tensor}) of a complete copy."""
    path = Path(path)
    index = json.loads((path / "index.json").read_text())
    raw = torch.from_file(str(path / "data.bin"), shared=False, size=max(1, index["nbytes"]), dtype=torch.uint8)
    out = {}
    for e in index["tensors"]:
        piece = raw[e["offset"]: e["offset"] + e["nbytes"]]
        out[e["name"]] = piece.view(bk.torch_dtype(e["dtype"])).reshape(e["shape"])
    return index["version"], out


def extend(path: str | os.PathLike, named: dict[str, torch.Tensor]) -> None:
    """Append tensors to a complete copy; it stays complete (index.json replaced, by rename, last)."""
    if not named:
        return
    path = Path(path)
    index = json.loads((path / "index.json").read_text())
    w = Writer.__new__(Writer)
    w.path, w.entries, w.nbytes = path, index["tensors"], index["nbytes"]
    w._f = open(path / "data.bin", "ab")
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
    directory of the sync in flight. One model on host; two while a sync runs."""

    def __init__(self, root: str | os.PathLike | None = None):
        root = Path(root or default_root())
        _remove_orphans(root)
        self.root = Path(tempfile.mkdtemp(prefix=f"labkit_stage_{os.getpid()}_", dir=root))
        self.good: dict | None = None  # {"path"|"model_dir", "version", "checksums"}
        self._n = 0
        atexit.register(self.close)  # tmpfs is memory: never leave a model's worth behind a driver that exits

    def staging(self) -> str:
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
            shutil.rmtree(old["path"], ignore_errors=True)

    def adopt_model_dir(self, model_dir: str, version: str, checksums: dict[str, str]) -> None:
        old = self.good
        self.good = {"model_dir": model_dir, "version": version, "checksums": dict(checksums)}
        if old and old.get("path"):
            shutil.rmtree(old["path"], ignore_errors=True)

    def discard(self, path: str | None) -> None:
        if path and (not self.good or self.good.get("path") != path):
            shutil.rmtree(path, ignore_errors=True)

    def tensors(self, dtype: str) -> dict[str, torch.Tensor]:
        """The last good weights by HF name, in the engine's dtype."""
        if self.good is None:
            raise RuntimeError("no last good weights recorded")
        if "path" in self.good:
            return load(self.good["path"])[1]
        return model_dir_tensors(self.good["model_dir"], dtype)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _names(good: dict) -> set[str]:
    if "path" in good:
        return {e["name"] for e in json.loads((Path(good["path"]) / "index.json").read_text())["tensors"]}
    out = set()
    for f in Path(good["model_dir"]).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            out.update(st.keys())
    return out


def _remove_orphans(root: Path) -> None:
    """Copies left by drivers that died without closing their store (their pid is gone)."""
    for d in root.glob("labkit_stage_*_*"):
        pid = d.name.split("_")[2]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def model_dir_tensors(model_dir: str, dtype: str) -> dict[str, torch.Tensor]:
    """A model directory's safetensors, floating tensors cast to the engine's serving dtype."""
    target = bk.torch_dtype(dtype)
    out = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        for n, t in load_file(str(f)).items():
            out[n] = t.to(target) if t.is_floating_point() else t
    return out
