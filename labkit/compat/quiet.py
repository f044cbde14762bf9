"""Known warnings of the pinned stack that say nothing actionable on the embedded default, filtered precisely.

On a CPU box Megatron-core, mbridge and SGLang warn at import that Transformer Engine, Apex, AWQ, GGUF and
Triton are absent, once per process (trainer rank, engine actor, SGLang's scheduler), each line prefixed by
Ray with the actor's name: 41 of the first demo's 140 lines, none actionable, burying the lines that are.
Each filter here names the start of one message and the exact module that warns, so the same words from
any other module, and every other warning, still show. `LABKIT_VERBOSE=1` (`labkit --verbose`) turns the
filters off.

The filters reach every process a run starts: `install` sets them in this process and prepends them to
`PYTHONWARNINGS`, which Ray's workers (a local cluster inherits the driver's environment) and SGLang's
subprocesses inherit; the actors call `install` themselves too, for clusters started elsewhere.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import warnings
from dataclasses import dataclass

VERBOSE_ENV = "LABKIT_VERBOSE"


@dataclass(frozen=True, slots=True)
class Known:
    """One known warning: its message's start (literal; no ',' or ':', which PYTHONWARNINGS splits on), the
    exact module that calls `warnings.warn`, and why it is not actionable here."""

    message: str
    module: str
    why: str
    category: str = "UserWarning"


_NO_TE = "Transformer Engine / Apex are CUDA-only; the torch fallbacks are what runs on CPU"
_NO_APEX = "Apex is CUDA-only; Megatron's torch norm is what runs on CPU"
_CPU_QUANT = "quantization kernels are CUDA-only; labkit serves unquantized weights"
KNOWN: tuple[Known, ...] = (
    *(Known("Transformer Engine and Apex are not installed", m, _NO_TE) for m in (
        "megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision", "megatron.core.optimizer",
        "megatron.core.optimizer.optimizer", "megatron.core.optimizer.clip_grads")),
    *(Known("Apex is not installed", m, _NO_APEX) for m in (
        "megatron.core.models.backends", "megatron.core.models.gpt.gpt_layer_specs",
        "mbridge.models.internvl3.transformer_layer")),
    Known("full scope is deprecated", "megatron.core.transformer.transformer_config",
          "Megatron's own default cuda_graph_scope; labkit captures no CUDA graphs"),
    Known("Only CUDA", "sglang.srt.layers.quantization.awq.awq", _CPU_QUANT),
    Known("Only CUDA", "sglang.srt.layers.quantization.gguf", _CPU_QUANT),
    Known("Triton is not supported on current platform", "sglang.kernels.ops.attention.fla.utils",
          "SGLang's CPU attention path is the intended one on a CPU box"),
)
# torch logs this (logging, not warnings) when nvcc is on PATH but no CUDA device is present.
KNOWN_LOGS: tuple[tuple[str, str], ...] = (("torch.utils.cpp_extension", "No CUDA runtime is found"),)


def verbose(env=None) -> bool:
    """True when the user asked to see everything (LABKIT_VERBOSE set to anything but '', '0', 'false')."""
    return (env if env is not None else os.environ).get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false")


def pythonwarnings() -> str:
    """The filters as PYTHONWARNINGS entries (`action:message:category:module`, comma-separated)."""
    return ",".join(f"ignore:{k.message}:{k.category}:{k.module}" for k in KNOWN)


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def install(env=None) -> bool:
    """Filter the known warnings in this process and its future children, unless verbose. Idempotent.
    Returns whether filters are on. A user's own PYTHONWARNINGS entries come after labkit's, so they win."""
    env = env if env is not None else os.environ
    if verbose(env):
        return False
    for k in KNOWN:
        warnings.filterwarnings("ignore", message=re.escape(k.message), category=getattr(builtins, k.category),
                                module=re.escape(k.module) + r"\Z")
    for name, start in KNOWN_LOGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.start == start for f in logger.filters):
            logger.addFilter(_DropMessage(start))
    ours, theirs = pythonwarnings(), env.get("PYTHONWARNINGS", "")
    if not theirs.startswith(ours):
        env["PYTHONWARNINGS"] = ours + ("," + theirs if theirs else "")
    return True


def stdout_to_stderr():
    """Megatron prints progress to stdout (`> number of parameters on (tensor, pipeline) ...` at model build);
    Ray forwards an actor's stdout to the driver's, which broke `labkit sync --json | jq` (a log line before
    the JSON). Inside this context those prints go to stderr."""
    import contextlib
    import sys

    return contextlib.redirect_stdout(sys.stderr)
