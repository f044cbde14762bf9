"""Gradient clipping with the MTP layers in a norm group of their own (TrainConfig.mtp_clip="own").

Why: Megatron clips one global norm over every parameter. During RL the MTP layers learn with the trunk detached
(labkit.trainer.mtp_loss), yet their gradient still entered that norm: whenever it pushed the global norm past
`clip_grad` (every step of the 60-step MTP experiment: grad norm > 1), the clip coefficient also shrank the
policy's step, so the trunk of a run whose draft trains differed from one whose draft is frozen, the draft
moving the policy after all. Upstream Megatron gives MTP its own norm group for this (PR #4116); 0.16.1 does not.

Here the trunk's gradients are clipped by the trunk's norm and the MTP layers' by theirs, each exactly as
Megatron clips (coefficient clip_grad / (norm + 1e-6), applied when below 1), on the DDP `main_grad` buffers
before `optimizer.step()` (whose own clip is off: OptimizerConfig.clip_grad=0). The norm counts each parameter
once: shared and tensor-parallel duplicate parameters are left out of it, as Megatron leaves them out, and it is
reduced over the model-parallel group (under expert parallelism, the experts' part over the expert
model-parallel group, as Megatron's chained optimizer does).
"""

from __future__ import annotations

import math

import torch

MTP_NAME = ".mtp."  # Megatron's MTP block (GPTModel.mtp); the same key as the MTP lr override (ParamKey "*.mtp.*")


def _groups(models) -> dict[str, list[torch.nn.Parameter]]:
    out: dict[str, list[torch.nn.Parameter]] = {"trunk": [], "mtp": []}
    for m in models:
        for name, p in m.named_parameters():
            if p.requires_grad:
                out["mtp" if MTP_NAME in f".{name}" else "trunk"].append(p)
    return out


def _grad(p: torch.nn.Parameter):
    return getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad


@torch.no_grad()
def clip_by_group(models, clip_grad: float) -> dict[str, float]:
    """Clip trunk and MTP gradients by their own norms, in place; {"trunk": norm, "mtp": norm} before clipping
    (0.0 for a group with no trainable parameters, e.g. the frozen MTP layers). A collective: every rank calls it."""
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    norms = {}
    for group, params in _groups(models).items():
        grads = [g for g in (_grad(p) for p in params) if g is not None]
        counted = [p for p in params if _grad(p) is not None and param_is_not_shared(p)
                   and param_is_not_tensor_parallel_duplicate(p)]
        # Every rank takes part in the norm's all-reduce, also one whose stage holds none of the group (with PP the
        # MTP layers live on the last stage only; a first stage that skipped it left the last one waiting).
        if ps.get_expert_model_parallel_world_size() == 1:
            norm = float(get_grad_norm_fp32([_grad(p) for p in counted],
                                            grad_stats_parallel_group=ps.get_model_parallel_group()))
        else:  # experts are split over EP ranks: their norm is reduced over the expert model-parallel group
            dense = [_grad(p) for p in counted if getattr(p, "allreduce", True)]
            expert = [_grad(p) for p in counted if not getattr(p, "allreduce", True)]
            expert_group = ps.get_expert_tensor_model_pipeline_parallel_group()
            norm = math.hypot(
                float(get_grad_norm_fp32(dense, grad_stats_parallel_group=ps.get_model_parallel_group())),
                float(get_grad_norm_fp32(expert, grad_stats_parallel_group=expert_group)))
        coeff = clip_grad / (norm + 1.0e-6)
        if coeff < 1.0:
            for g in grads:
                g.mul_(coeff)
        norms[group] = norm
    return norms
