"""labkit's fixes for Mixture-of-Experts models on mbridge 0.15.1 + megatron-core 0.16.1 without Transformer
Engine (the CPU box; GPU clusters with TE keep mbridge's stock MoE path and none of this is switched on).

Each fix names the failure it prevents (found by building a tiny Qwen3-MoE through mbridge on gloo;
../shared/reference/feasibility_moe.md lists them in the order they surfaced):

- `persist_layer_norm` (mbridge's MoE configs set it): "persist_layer_norm not supported by torch LayerNorm";
- the alltoall token dispatcher creates `torch.cuda.Stream()` at construction ("CUDA driver version is
  insufficient"): the allgather dispatcher instead, which then refuses mbridge's `variable_seq_lengths=True`;
- `GroupedMLP` needs the grouped_gemm package: `SequentialMLP` instead, whose experts are
  `mlp.experts.local_experts.{i}.linear_fc{1,2}.weight`; mbridge maps only TE's `linear_fc{1,2}.weight{i}`
  ("NotImplementedError: Unsupported parameter name"), so local names are rewritten to that form, with the
  expert-parallel offset mbridge's own EP logic would add;
- megatron-core defines `te_general_gemm` only inside `try: import transformer_engine` and then reads it in
  the router (`NameError: name 'te_general_gemm' is not defined`);
- the shared-expert overlap works only with the alltoall dispatcher.
"""

from __future__ import annotations

import re

from labkit.models.hf import num_experts

# The Megatron config fields set for MoE without TE (through mbridge's extra_args, which survive
# `set_extra_args` rebuilding the config).
CPU_MOE_ARGS = {"persist_layer_norm": False, "moe_token_dispatcher_type": "allgather", "variable_seq_lengths": False,
                "moe_grouped_gemm": False, "moe_shared_expert_overlap": False}
_LOCAL_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.local_experts\.(?P<i>\d+)\.(?P<fc>linear_fc[12])\.weight$")


def sequential_name(name: str, offset: int = 0) -> str:
    """A SequentialMLP expert weight's global name in mbridge's (TEGroupedMLP) form:
    `...mlp.experts.local_experts.3.linear_fc1.weight` -> `...mlp.experts.linear_fc1.weight{3 + offset}`.
    Any other name is returned unchanged."""
    m = _LOCAL_EXPERT.match(name)
    return name if m is None else f"{m['prefix']}.{m['fc']}.weight{int(m['i']) + offset}"


def patch_moe(bridge, use_te: bool) -> None:
    """Switch the fixes above on for `bridge` when its model has experts and Transformer Engine is absent."""
    if use_te or not num_experts(bridge.hf_config):
        return
    _megatron_names()
    bridge.extra_args.update(CPU_MOE_ARGS)
    base = bridge._weight_name_mapping_mcore_local_to_global

    def local_to_global(model, consider_ep: bool = True) -> dict[str, str]:
        out = base(model, consider_ep=False)
        mpu = bridge.mpu
        offset = num_experts(bridge.hf_config) // mpu.ep_size * mpu.ep_rank if consider_ep else 0
        return {k: sequential_name(v, offset) for k, v in out.items()}

    bridge._weight_name_mapping_mcore_local_to_global = local_to_global


def _megatron_names() -> None:
    from megatron.core.transformer.moe import moe_utils  # Megatron is crossed here only

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

