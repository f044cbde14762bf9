"""labkit's fixes to mbridge 0.15.1, applied to one bridge instance (mbridge itself is left untouched).

- local (non-Transformer-Engine) layer spec where TE is absent, plus the norm-name mappings it needs;
- MiMo's MTP block spec (stock MimoBridge passes the config as the spec and fails even on GPU);
- transformers 5 moved `rope_theta` into `rope_parameters`;
- MiMo computes its MTP projection on cat([hidden, embeds]) while Megatron uses cat([embeds, hidden]):
  `input_proj` <-> `eh_proj` swap their two column halves on load and on export (slime PR #691);
- under PP>1 the MTP stage re-exports the shared embedding: duplicate names are dropped on export.
"""

from __future__ import annotations

import weakref

import torch

from labkit.models.hf import fix_rope_theta
from labkit.trainer import mla, vocab
from labkit.trainer.moe import patch_moe

SWAP_HALVES = ("eh_proj.weight",)


def has_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
        return torch.cuda.is_available()
    except ImportError:
        return False


def swap_halves(w: torch.Tensor) -> torch.Tensor:
    """[A | B] -> [B | A] along the input dimension (its own inverse)."""
    h = w.shape[1] // 2
    return torch.cat([w[:, h:], w[:, :h]], dim=1).contiguous()


def make_bridge(hf_config, dtype: torch.dtype):
    """mbridge's bridge for `hf_config`, with labkit's fixes (DeepSeek-V3's replace its class: they act while
    the bridge is constructed)."""
    from mbridge import AutoBridge
    from mbridge.core.bridge import _MODEL_REGISTRY

    if hf_config.model_type == "deepseek_v3" and not has_transformer_engine():
        return patch_bridge(mla.bridge_class(_MODEL_REGISTRY["deepseek_v3"])(hf_config, dtype=dtype))
    return patch_bridge(AutoBridge.from_config(hf_config, dtype=dtype))


def patch_bridge(bridge):
    """Return `bridge` with labkit's fixes bound to it."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec

    cls = type(bridge)
    use_te = has_transformer_engine()
    is_mimo = getattr(bridge.hf_config, "model_type", "") == "mimo"

    def layer_spec(self, vp_stage=None):
        self.has_vp_stage = True
        spec = get_gpt_decoder_block_spec(self.config, use_transformer_engine=use_te, vp_stage=vp_stage)
        return spec if use_te or not getattr(self.config, "multi_latent_attention", False) \
            else mla.local_core_attention(spec)

    bridge._get_transformer_layer_spec = layer_spec.__get__(bridge)
    if not use_te:
        # The local spec keeps norms as separate modules instead of TE's fused layer_norm_weight.
        post_norm = ["model.layers.{layer_number}.post_attention_layernorm.weight"]
        bridge._MLP_MAPPING = {**cls._MLP_MAPPING, "pre_mlp_layernorm.weight": post_norm}
        bridge._OTHER_MAPPING = {**getattr(cls, "_OTHER_MAPPING", {}),
                                 "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]}
        bridge._ATTENTION_MAPPING = {**cls._ATTENTION_MAPPING,
                                     "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]}

    base_args = bridge._get_gptmodel_args

    def gptmodel_args(self):
        fix_rope_theta(self.hf_config)
        if not self.config.mtp_num_layers:
            return base_args()
        from mbridge.models.qwen2 import Qwen2Bridge

        ret = Qwen2Bridge._get_gptmodel_args(self)
        ret["mtp_block_spec"] = get_gpt_mtp_block_spec(self.config, self._get_transformer_layer_spec(),
                                                       use_transformer_engine=use_te)
        return ret

    bridge._get_gptmodel_args = gptmodel_args.__get__(bridge)
    patch_moe(bridge, use_te)
    vocab.pad_vocab(bridge, bridge.mpu.tp_size)

    if is_mimo:
        to_mcore, to_hf = bridge._weight_to_mcore_format, bridge._weight_to_hf_format

        def weight_to_mcore(name, hf_weights):
            w = to_mcore(name, hf_weights)
            return swap_halves(w) if name.endswith(SWAP_HALVES) else w

        def weight_to_hf(name, w):
            names, ws = to_hf(name, w)
            if name.endswith(SWAP_HALVES):
                ws = [swap_halves(x) for x in ws]
            return names, ws

        bridge._weight_to_mcore_format = weight_to_mcore
        bridge._weight_to_hf_format = weight_to_hf
    _keep_name_mapping(bridge)
    return bridge


def _keep_name_mapping(bridge) -> None:
    """mbridge maps every Megatron name to its HF names with string work on each call, for every tensor of every
    sync, thousands per sync of an MoE model. The mapping is a function of the name once the bridge is patched,
    so each answer is kept (a copy handed out)."""
    names_of, kept = bridge._weight_name_mapping_mcore_to_hf, {}

    def mapping(name: str) -> list[str]:
        got = kept.get(name)
        if got is None:
            got = kept[name] = list(names_of(name))
        return list(got)

    bridge._weight_name_mapping_mcore_to_hf = mapping


def _export_no_pp(bridge, models):
    """mbridge's export_weights minus its pipeline collectives, for PP=1 and EP=1 models.

    mbridge exchanges every tensor's name and spec over the PP group (all_gather_object + broadcast) even
    when that group has one rank: collectives per tensor, and an MoE model has thousands. Megatron keeps a router's
    `expert_bias` (DeepSeek-V3's e_score_correction_bias) out of named_parameters, as a persistent buffer; it is
    exported from the buffers, as mbridge does from the state dict. Neither walks `state_dict()` per sync (it builds a
    dict of every tensor each time): the walk is kept per model (`_exported`).
    """
    from mbridge.core.util import unwrap_model

    tp, group = bridge.mpu.tp_size, bridge.mpu.tp_group
    for model in models:
        model = unwrap_model(model)
        for name, param in _exported(bridge, model):
            if getattr(param, "tensor_model_parallel", False) and tp > 1:
                parts = [torch.empty_like(param) for _ in range(tp)]
                torch.distributed.all_gather(parts, param, group=group)
                param = bridge._weight_merge_across_tp(name, parts, param)
            yield from zip(*bridge._weight_to_hf_format(name, param))


# model -> [(global name, owning module (weakly), attribute, is a buffer)]: what `_exported` walks, kept per model
_WALK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _exported(bridge, model) -> list[tuple[str, torch.Tensor]]:
    """(mbridge's global name, tensor) of each parameter of `model` and each router `expert_bias` buffer, in
    `named_parameters` order. Walking the module tree (`named_parameters`, `named_buffers`) on every sync would
    be paid per tensor of an MoE model's thousands: the walk is kept per model, and each tensor is read from its owner
    again on every sync, so a parameter replaced in place (`module.weight = ...`) is the one exported; one that is gone
    makes the walk start over."""
    walk = _WALK.get(model)
    if walk is not None:
        got = [(name, _owned(owner(), attr, buf)) for name, owner, attr, buf in walk]
        if all(t is not None for _, t in got):
            return got
    params = dict(model.named_parameters())
    buffers = {k: v for k, v in model.named_buffers() if "expert_bias" in k and k not in params}
    names = bridge._weight_name_mapping_mcore_local_to_global(model, consider_ep=False)
    walk = _WALK[model] = []
    for local in [*params, *buffers]:
        owner, _, attr = local.rpartition(".")
        walk.append((names[local], weakref.ref(model.get_submodule(owner)), attr, local in buffers))
    return _exported(bridge, model)


def _owned(owner, attr: str, buffer: bool) -> torch.Tensor | None:
    if owner is None:  # a module dropped from the model
        return None
    return (owner._buffers if buffer else owner._parameters).get(attr)


def export_unique(bridge, models, fast: bool = True):
    """HF-named full tensors with duplicates dropped (PP>1 + MTP exports the shared embedding twice)."""
    single = bridge.mpu.pp_size == 1 and bridge.mpu.vpp_size in (None, 1) and bridge.mpu.ep_size == 1
    gen = _export_no_pp(bridge, models) if fast and single else bridge.export_weights(models)
    seen = set()
    for name, t in gen:
        if name in seen:
            continue
        seen.add(name)
        yield name, t
