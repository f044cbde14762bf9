"""Import-only placeholder for `sgl_kernel` on machines without CUDA (labkit.compat.sglang).

PyPI's sglang-kernel is a CUDA build (it needs libcuda at import) and the CPU build is source-only.
SGLang's CPU engine imports a few `*_cpu` kernels at module load but its basic generate and
weight-update paths never call them. Every name here is a function that raises NotImplementedError
naming itself, so a path that needs a real kernel fails loudly, never silently. The exceptions compute:
`torch.ops.sgl_kernel.murmur_hash32_cpu`, which SGLang's seeded sampler calls (labkit.compat.seeded), and the ops
of SGLang's speculative-decoding CPU lane (labkit.compat.spec_cpu.kernels).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__version__ = "0.0.0+labkit.placeholder"
LABKIT_PLACEHOLDER = True


def _stub(name):
    def kernel(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel placeholder: {name} called; this path needs a real SGLang kernel "
            "(GPU, or a CPU build of sgl_kernel)"
        )

    kernel.__name__ = name.rsplit(".", 1)[-1]
    kernel.__qualname__ = name
    return kernel


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    from labkit.compat.spec_cpu.kernels import KERNELS  # speculative decoding's ops, in torch

    return KERNELS.get(name) or _stub(f"sgl_kernel.{name}")


def _module_getattr(prefix):
    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{prefix}.{name}")

    return getattr_


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every `sgl_kernel.<sub>` module; `scalar_type` is pure Python and is served from our copy."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("sgl_kernel.") and fullname != "sgl_kernel.scalar_type":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _module_getattr(spec.name)
        return m

    def exec_module(self, module):
        pass


if not any(type(f).__name__ == "_Finder" and type(f).__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

# This module is imported early in every SGLang process on a CPU box (engine, scheduler, HTTP server), so
# labkit's loopback guard rides along: the scheduler builds its TP group from tcp://127.0.0.1:<nccl_port>,
# and torch's store for it would otherwise listen on the wildcard (labkit.compat.loopback).
from labkit.compat import loopback as _loopback  # noqa: E402

_loopback.patch_tcp_rendezvous()

# The one kernel here that computes: SGLang's seeded sampler hashes with murmur_hash32_cpu on CPU
# (labkit.compat.seeded, the same arithmetic as SGLang's Triton kernel, in torch).
from labkit.compat import seeded as _seeded  # noqa: E402

_seeded.register_kernel()

# SGLang's CPU engine at TP > 1: no NCCL communicator for CPU groups (labkit.compat.cpu_tp).
from labkit.compat import cpu_tp as _cpu_tp  # noqa: E402

_cpu_tp.patch_parallel_state()
