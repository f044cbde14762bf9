"""SGLang's CPU engine at TP > 1: what the pinned SGLang 0.5.23 needs to start `tp_size=2` on a box without CUDA.

Two things stop `sglang.Engine(tp_size=2, device="cpu")` there, each fixed here (on only without CUDA):

1. Each rank binds its OpenMP threads to the cores `SGLANG_CPU_OMP_THREADS_BIND` names, one `|`-separated group
   per rank; unset, SGLang wants a NUMA node per rank (`utils/numa_utils.py:459-471`: an AssertionError on a
   one-node box). `threads_bind(tp)` splits this process's CPUs into tp contiguous groups ("0|1" on two cores);
   the engine's launch sets it unless the user did (`launch_env`). SGLang then cannot size the KV pool from a
   rank's share of memory (`utils/common.py:911-918`), so the engine needs `max_total_tokens`, which labkit's
   engine configs set.
2. Every TP group builds a NCCL communicator over its CPU group (`distributed/parallel_state.py:463-468` ->
   `device_communicators/pynccl.py:116`: "Expected a cuda device, but got: cpu"). `patch_parallel_state`
   makes `init_model_parallel_group` default to `use_pynccl=False`; a CPU rank's all-reduce then runs over its
   gloo device group (`GroupCoordinator.all_reduce`'s branch for CPU tensors without sgl_kernel's shm kernel,
   which labkit's placeholder does not have). It is installed in every SGLang process by the sgl_kernel
   placeholder (labkit.compat.sglang), as an import hook: the scheduler builds its groups before it imports
   any model code of labkit's.

Two ranks on a 2-core box run slower than one (each rank has one core, and every layer waits on an all-reduce);
that is fine for correctness, and a bench says so.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

TARGET = "sglang.srt.distributed.parallel_state"
BIND = "SGLANG_CPU_OMP_THREADS_BIND"


def threads_bind(tp: int, cpus: list[int] | None = None) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `tp` ranks: this process's CPUs (or `cpus`) in tp contiguous groups, the
    remainder to the first groups ("0|1" for 2 ranks on 2 cores, "0-2|3-5|6-7" for 3 on 8). ValueError naming
    tp when there are fewer CPUs than ranks (a rank with no core would not run)."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if tp < 1 or tp > len(cpus):
        raise ValueError(f"tp={tp} is invalid on this CPU engine: it must be between 1 and the {len(cpus)} CPUs "
                         "this process may run on (each rank binds its threads to cores of its own)")
    groups, start = [], 0
    for r in range(tp):
        n = len(cpus) // tp + (r < len(cpus) % tp)
        part = cpus[start:start + n]
        start += n
        groups.append(str(part[0]) if len(part) == 1 else
                      f"{part[0]}-{part[-1]}" if part[-1] - part[0] == len(part) - 1 else ",".join(map(str, part)))
    return "|".join(groups)


def launch_env(tp: int, env: dict | None = None) -> dict:
    """What an engine process at `tp` ranks needs in its environment on CPU: the thread binding, unless set."""
    env = os.environ if env is None else env
    return {BIND: threads_bind(tp)} if tp > 1 and not env.get(BIND) else {}


def _no_pynccl(module) -> None:
    init = module.init_model_parallel_group
    if getattr(init, "labkit_cpu_tp", False):
        return

    def init_model_parallel_group(*args, **kwargs):
        if kwargs.get("use_pynccl") is None:
            kwargs["use_pynccl"] = False
        return init(*args, **kwargs)

    init_model_parallel_group.labkit_cpu_tp = True
    module.init_model_parallel_group = init_model_parallel_group


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `_no_pynccl` on SGLang's parallel_state as it is imported (the module's own functions call the
    patched name through its globals)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _no_pynccl(module)

        spec.loader.exec_module = exec_module
        return spec


def patch_parallel_state() -> None:
    """Install the hook (idempotent); patch at once if SGLang's parallel_state is imported already."""
    if TARGET in sys.modules:
        _no_pynccl(sys.modules[TARGET])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
