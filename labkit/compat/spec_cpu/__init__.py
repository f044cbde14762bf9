"""SGLang's own speculative decoding (EAGLE/NEXTN, `EAGLEWorkerV2`) on a CPU engine: what SGLang 0.5.23 lacks there.

SGLang already has a CPU lane for its EAGLE worker (run without the overlap scheduler and without CUDA graphs on
CPU); what stops it on a machine without CUDA and without AMX is filled in here, in torch, each part in the module
that says why:
- `kernels`: the `sgl_kernel.*_cpu` ops the lane calls (served by labkit's sgl_kernel placeholder);
- `attention`: torch_native attention for the verify and multi-step draft forwards, and the draft-backend entries;
- `sampling`: verification at temperature > 0 (SGLang's CPU lane is silently greedy there).
On only without CUDA (`labkit.compat.sglang.needed`); `apply()` runs in every SGLang scheduler, through labkit's
model package (`labkit.engine.inside.sglang_models`), after SGLang is imported and before the workers start.
Top-k 1 chains only (`EngineConfig.speculative` refuses a tree on CPU).
"""

from __future__ import annotations

_applied: list[str] = []


def apply() -> list[str]:
    """Patch SGLang's speculative path in this (scheduler) process. Idempotent."""
    if _applied:
        return list(_applied)
    from labkit.compat.sglang import check_sglang_version
    from labkit.compat.spec_cpu import attention, sampling

    check_sglang_version()  # the patched functions and their line numbers are 0.5.23's

    attention.patch_verify()
    attention.patch_draft_factory()
    sampling.patch_verify_sampling()
    _applied.extend(["torch_native verify", "torch_native draft backends", "target-only verify sampling"])
    return list(_applied)
