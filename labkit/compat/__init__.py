"""Compat layers that let the real stack run on a machine without CUDA. Each is switched on only there."""

from __future__ import annotations


def planned() -> list[str]:
    """The compat layers labkit switches on in this environment (empty where CUDA is present)."""
    import torch

    if torch.cuda.is_available():
        return []
    return ["cuda_only_imports", "megatron_cpu", "sglang_cpu"]
