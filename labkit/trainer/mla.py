"""labkit's fixes for DeepSeek-V3 (MLA attention + MoE) on mbridge 0.15.1 + megatron-core 0.16.1 without
Transformer Engine. Switched on only where TE is absent (the CPU box); with TE, mbridge's own bridge runs.

Each fix names the failure it prevents (../shared/reference/feasibility_moe.md, fixes 7-15):
- mbridge passes `max_position_embeddings` to MLATransformerConfig, which takes
  `original_max_position_embeddings` ("unexpected keyword argument 'max_position_embeddings'");
- mbridge sets `mtp_num_layers=0` for a checkpoint without MTP layers; GPTModel then clones labels that are None
  (`'NoneType' object has no attribute 'clone'`): None, as Megatron means "no MTP";
- mbridge's DeepSeek safetensor reader refuses anything but bf16 (`raise NotImplemented("only support bfloat16")`):
  the plain reader for fp32;
- transformers 5 keeps YaRN in `rope_parameters`, mbridge reads `rope_scaling` only and silently builds plain
  RoPE: with YaRN factor 4 the logits were off by 1.70 and the argmax moved; the YaRN fields are copied over;
- Megatron's local-spec `DotProductAttention` takes no `k_channels` / `v_channels` (MLA's heads are wider for q/k
  than for v): a subclass that takes them and sizes its output by v;
- `multi_latent_attention.HAVE_TE` is True when TE's module imports with labkit's stand-ins, and MLA then calls
  `isinstance(x, TELinear)` on a stand-in ("isinstance() arg 2 must be a type"): False;
- the local spec keeps MLA's norms as `q_layernorm` / `kv_layernorm` modules (TE fuses them into the linears):
  mapped to `q_a_layernorm` / `kv_a_layernorm`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

YARN_FIELDS = ("factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "original_max_position_embeddings")
LOCAL_NORMS = {
    "self_attention.q_layernorm.weight": ["model.layers.{layer_number}.self_attn.q_a_layernorm.weight"],
    "self_attention.kv_layernorm.weight": ["model.layers.{layer_number}.self_attn.kv_a_layernorm.weight"],
}


def yarn_scaling(hf_config) -> dict | None:
    """mbridge's `rope_scaling` dict from a transformers 5 config's `rope_parameters` (None: not YaRN)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    if params.get("rope_type") != "yarn":
        return None
    return {"type": "yarn", **{k: params[k] for k in YARN_FIELDS if k in params}}


def bridge_class(base: type) -> type:
    """`base` (mbridge's DeepseekV3Bridge) with the fixes above that act at construction."""
    from mbridge.core.safetensor_io import SafeTensorIO

    class LabkitDeepseekV3Bridge(base):
        _ATTENTION_MAPPING = {**base._ATTENTION_MAPPING, **LOCAL_NORMS}

        def _build_config(self):
            if getattr(self.hf_config, "rope_scaling", None) is None and yarn_scaling(self.hf_config):
                self.hf_config.rope_scaling = yarn_scaling(self.hf_config)
            return super()._build_config()

        def _build_base_config(self, **kwargs):
            if "max_position_embeddings" in kwargs:
                kwargs["original_max_position_embeddings"] = kwargs.pop("max_position_embeddings")
            if kwargs.get("mtp_num_layers") == 0:
                kwargs["mtp_num_layers"] = None
            return super()._build_base_config(**kwargs)

        def _get_safetensor_io(self, weights_path: str):
            if self.dtype == torch.bfloat16:
                return super()._get_safetensor_io(weights_path)
            return SafeTensorIO(self._get_actual_hf_path(weights_path))

    return LabkitDeepseekV3Bridge


def local_core_attention(block_spec):
    """`block_spec` (a local-spec decoder block) with MLA's core attention swapped for `MLADotProductAttention`."""
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    multi_latent_attention.HAVE_TE = False
    for layer in block_spec.layer_specs:
        attn = layer.submodules.self_attention
        if getattr(attn.submodules, "core_attention", None) is DotProductAttention and \
                issubclass(attn.module, multi_latent_attention.MultiLatentAttention):
            attn.submodules = dataclasses.replace(attn.submodules, core_attention=_mla_core_attention())
    return block_spec


@functools.cache
def _mla_core_attention() -> type:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        """Megatron's local attention, accepting MLA's separate q/k and v head sizes."""

        def __init__(self, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    return MLADotProductAttention
