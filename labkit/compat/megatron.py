"""Megatron-core on a machine without CUDA.

megatron-core assumes a CUDA device in a handful of places (device queries used as device arguments,
the CUDA RNG tracker, the default causal mask, the pipeline schedule's scratch tensors and synchronize,
and the optimizers' device/type checks). These shims redirect exactly those to the CPU. They are
switched on only when no CUDA device is present, applied once, and refuse to touch a megatron-core
version they were not written against (the call sites move between releases).
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch
from torch.overrides import TorchFunctionMode

from labkit.compat import SUPPORTED, check_version

SUPPORTED_MEGATRON = SUPPORTED["megatron-core"][0]
_applied: list[str] = []


def check_megatron_version(version: str | None = None) -> str:
    """Refuse a megatron-core other than the one these shims were checked against (default: the installed one,
    read from metadata, so a mismatch is named before megatron is imported)."""
    return check_version("megatron-core", version)


def active() -> list[str]:
    """Names of the compat layers switched on in this process."""
    return list(_applied)


def needed() -> bool:
    return not torch.cuda.is_available()


class CPURNGStatesTracker:
    """Drop-in for Megatron's CudaRNGStatesTracker that forks the CPU generator (keeps per-TP-rank dropout seeds)."""

    def __init__(self, *a, **k):
        self.reset()

    def is_initialized(self):
        return self._is_initialized

    def reset(self):
        self._is_initialized, self.states_, self.seeds_ = False, {}, set()

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        self._is_initialized, self.states_ = True, states

    def add(self, name, seed):
        self._is_initialized = True
        self.seeds_.add(seed)
        orig = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(orig)

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


def model_parallel_seed(seed: int) -> None:
    """Megatron's model_parallel_cuda_manual_seed, on CPU when there is no GPU."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as r

    if not needed():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    t = CPURNGStatesTracker()
    r._CUDA_RNG_STATE_TRACKER = t
    r._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.manual_seed(seed)
    t.add(r._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    t.add(r._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + ps.get_tensor_model_parallel_rank())
    t.add(r._EXPERT_PARALLEL_RNG_TRACKER_NAME,
          seed + 1024 + 100 * ps.get_expert_model_parallel_rank() + ps.get_expert_tensor_parallel_rank())


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites device='cuda' tensor factories to the CPU. Scoped to optimizer build/step, never global."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        d = kwargs.get("device")
        if d is not None and ((isinstance(d, str) and d.startswith("cuda"))
                              or (isinstance(d, torch.device) and d.type == "cuda") or isinstance(d, int)):
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


def optimizer_scope():
    """Context for building and stepping Megatron's optimizers (they create 'cuda' scratch tensors)."""
    return CudaToCpuMode() if needed() else contextlib.nullcontext()


def apply() -> list[str]:
    """Switch on every Megatron CPU shim; a no-op where CUDA is present or when already applied."""
    if not needed() or _applied:
        return active()
    check_megatron_version()  # before anything is patched or imported: a mismatch is named, not hit in a patch
    from labkit.compat import cuda_only

    cuda_only.apply()
    _applied.append("cuda_only_imports")
    import megatron.core  # noqa: F401

    # Device queries used as *device arguments* (RoPE inv_freq, MTP tracker, TP buffers, memory buffer).
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None  # p2p_communication syncs after every send/recv
    _applied.append("device")

    # attention_mask=None (mbridge and RL code) builds the default causal mask on "cuda".
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as tu

    @functools.lru_cache(maxsize=32)
    def causal_mask(sq: int, sk: int | None = None) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sk or sq), diagonal=1).bool()

    tu.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    _applied.append("causal_mask")

    # The pipeline schedule allocates its token counter with device="cuda".
    from megatron.core.pipeline_parallel import schedules

    class _TorchProxy(types.ModuleType):
        def __getattr__(self, n):
            return getattr(torch, n)

    proxy = _TorchProxy("torch")

    def zeros(*a, **k):
        if str(k.get("device", "")).startswith("cuda"):
            k["device"] = "cpu"
        return torch.zeros(*a, **k)

    proxy.zeros = zeros
    schedules.torch = proxy
    _applied.append("pipeline_schedule")

    # Megatron optimizers assert tensor.type() == 'torch.cuda.FloatTensor'; report CPU tensors as such.
    orig_type = torch.Tensor.type

    def _type(self, dtype=None, non_blocking=False, **kw):
        if dtype is None and not kw:
            t = orig_type(self)
            return t.replace("torch.", "torch.cuda.", 1) if t.startswith("torch.") and ".cuda." not in t else t
        return orig_type(self, dtype, non_blocking, **kw)

    torch.Tensor.type = _type
    _applied.append("optimizer_types")
    return active()
