"""Run a real SGLang 0.5.23 engine on a machine without CUDA.

SGLang's CPU lane is switched on by `SGLANG_USE_CPU_ENGINE=1` (without it the scheduler falls back to a
vLLM RoPE import). That lane imports a few `*_cpu` kernels from `sgl_kernel` at module load, but PyPI's
`sglang-kernel` is a CUDA build that dies at import (libcuda.so.1), and the CPU build is source-only.
labkit therefore shadows it with an import-only placeholder (`labkit/compat/sglang_cpu/sgl_kernel`, whose
functions raise if called; the basic generate and weight-update paths never call them). The placeholder
must be first on sys.path here AND on PYTHONPATH, because SGLang spawns its scheduler/detokenizer (and the
HTTP server is a separate process) with a fresh interpreter.

Tensors handed to the scheduler are pickled through torch.multiprocessing; with the default fd strategy
a CPU tensor crossing to an HTTP server kills it (`AuthenticationError: digest sent was rejected`), so we
use the `file_system` strategy. An engine's shutdown SIGKILLs its children (incl. the resource tracker and
torch_shm_manager that would unlink files), leaving `/dev/shm/sglang_loads_*.shm`, `sem.mp-*` and
`torch_<pid>_*` files behind: `cleanup_shm()` removes those no live process still holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from labkit import pids
from labkit.compat import SUPPORTED, check_version

SUPPORTED_SGLANG = SUPPORTED["sglang"][0]
PLACEHOLDER_DIR = str(Path(__file__).resolve().parent / "sglang_cpu")
SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("sglang_loads_", "sem.mp-")
_applied: list[str] = []


def check_sglang_version(version: str | None = None) -> str:
    """Refuse an SGLang other than the one these shims were checked against (read from metadata, no import)."""
    return check_version("sglang", version)


def needed() -> bool:
    import torch

    return not torch.cuda.is_available()


def env() -> dict[str, str]:
    """Environment for a process that will import sglang on this machine (e.g. a launch_server subprocess)."""
    e = dict(os.environ)
    if needed():
        e["SGLANG_USE_CPU_ENGINE"] = "1"
        parts = [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p and p != PLACEHOLDER_DIR]
        e["PYTHONPATH"] = os.pathsep.join([PLACEHOLDER_DIR, *parts])
    return e


def apply() -> list[str]:
    """Prepare this process to import and run SGLang (idempotent). Returns the active layer names.

    Must run before the first `import sglang` / `import sgl_kernel` in the process.
    """
    check_sglang_version()
    if not needed():
        return []
    if _applied:
        return list(_applied)
    if "sgl_kernel" in sys.modules and not getattr(sys.modules["sgl_kernel"], "LABKIT_PLACEHOLDER", False):
        raise RuntimeError("the CUDA sgl_kernel was imported before labkit.compat.sglang.apply(); call apply() "
                           "before importing sglang in this process")
    import torch.multiprocessing

    from labkit.compat import cuda_only

    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    _applied.append("SGLANG_USE_CPU_ENGINE=1")
    if sys.path[0] != PLACEHOLDER_DIR:
        while PLACEHOLDER_DIR in sys.path:
            sys.path.remove(PLACEHOLDER_DIR)
        sys.path.insert(0, PLACEHOLDER_DIR)
    os.environ["PYTHONPATH"] = env()["PYTHONPATH"]
    _applied.append("sgl_kernel placeholder")
    torch.multiprocessing.set_sharing_strategy("file_system")
    _applied.append("torch sharing strategy file_system")
    if cuda_only.apply():
        _applied.append("cuda_only import guard")
    return list(_applied)


def active() -> list[str]:
    return list(_applied)


def _held_paths() -> set[str]:
    """Every /dev/shm path some live process has open or mapped (ours or readable others')."""
    held: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("/dev/shm/"):
                    held.add(target.removesuffix(" (deleted)"))
            for line in (proc / "maps").read_text().splitlines():
                i = line.find("/dev/shm/")
                if i >= 0:
                    held.add(line[i:].removesuffix(" (deleted)"))
        except (OSError, PermissionError):
            continue
    return held


def cleanup_shm(own_pid: int | None = None) -> list[str]:
    """Remove SGLang's leftover /dev/shm files that no live process holds (open or mapped).

    `sglang_loads_*` (load-snapshot slots) and `sem.mp-*` (multiprocessing semaphores) outlive an engine
    because its shutdown SIGKILLs the children that would unlink them. `torch_<pid>_*` (file_system
    sharing) are removed only when their creator is dead or is `own_pid` (the caller, after its engine is
    gone): a live creator may still hand its handle to a reader. Returns the removed paths.
    """
    if not SHM_DIR.is_dir():
        return []
    held, removed = _held_paths(), []
    for f in SHM_DIR.iterdir():
        name = f.name
        if str(f) in held:
            continue
        if name.startswith("torch_"):
            parts = name.split("_")
            if len(parts) < 3 or not parts[1].isdigit():
                continue
            pid = int(parts[1])
            if pid != own_pid and pids.alive(pid):
                continue
        elif not name.startswith(SHM_PREFIXES):
            continue
        try:
            f.unlink()
            removed.append(str(f))
        except FileNotFoundError:
            pass
    return removed
