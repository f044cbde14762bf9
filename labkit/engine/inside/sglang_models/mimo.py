"""SGLang's MiMoForCausalLM plus an MTP draft-weight store (and labkit's weight access, `weights.LabkitWeights`).

MTP draft store: SGLang's target model skips `model.mtp_layers.*` (only a speculative draft worker, MiMoMTP,
loads them), so an engine without speculative decoding would hold no MTP weights. labkit's weight sync still
sends them with every sync and verifies them bitwise on the engine, and labkit's speculative-decoding loop reads
them back. So the target model keeps them as plain parameters under
`model.mtp_layers.{i}` in SGLang's own layout (q/k/v fused into `self_attn.qkv_proj`, gate/up into
`mlp.gate_up_proj`), where SGLang's weight checker (`check_weights("checksum")`, over `named_parameters()`)
and `get_weights_by_name` see them. The store never runs in forward; with `EngineConfig.speculative` the
draft worker (labkit's MiMoMTP, `mimo_mtp.py`) loads and runs its own copy, verified beside the store
(labkit.engine.draft).
"""

from __future__ import annotations

import re

import torch
from sglang.srt.models.mimo import MiMoForCausalLM as _SGLangMiMo
from torch import nn

from labkit import failpoints as fp
from labkit.engine.inside import apply
from labkit.engine.inside.sglang_models.weights import IGNORED, LabkitWeights, with_failpoint

_MTP_NAME = re.compile(r"^model\.mtp_layers\.(\d+)\.(.+)$")


class _Weights(nn.Module):
    """Parameters only (no forward). `output_sizes`: the row blocks of a fused projection, like SGLang's
    merged linears, so shard names resolve the same way for the trunk and the store. dtype/device come from
    the loader's defaults (set_default_torch_dtype + device context), as for SGLang's own layers."""

    def __init__(self, shape: tuple[int, ...], output_sizes: list[int] | None = None, bias: bool = False):
        super().__init__()
        self.output_sizes = list(output_sizes or [shape[0]])
        assert sum(self.output_sizes) == shape[0], (shape, self.output_sizes)
        dtype = torch.get_default_dtype()
        self.weight = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)  # padding stays 0
        if bias:
            self.bias = nn.Parameter(torch.zeros(shape[0], dtype=dtype), requires_grad=False)


class _MTPLayerStore(nn.Module):
    """One MTP layer's weights under their HF module names (attention/MLP fused as in SGLang's Qwen2 layer)."""

    def __init__(self, config):
        super().__init__()
        h, heads = config.hidden_size, config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or h // heads  # as SGLang's Qwen2DecoderLayer
        q, kv, ffn = heads * head_dim, kv_heads * head_dim, config.intermediate_size
        for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm", "input_layernorm",
                     "post_attention_layernorm"):
            setattr(self, norm, _Weights((h,)))
        self.input_proj = _Weights((h, 2 * h))
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = _Weights((q + 2 * kv, h), [q, kv, kv], bias=True)  # Qwen2: qkv bias
        self.self_attn.o_proj = _Weights((h, q))
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = _Weights((2 * ffn, h), [ffn, ffn])
        self.mlp.down_proj = _Weights((h, ffn))


class MiMoForCausalLM(LabkitWeights, _SGLangMiMo):
    def __init__(self, config, quant_config=None, prefix: str = "", **kwargs):
        super().__init__(config, quant_config=quant_config, prefix=prefix, **kwargs)
        n = int(getattr(config, "num_nextn_predict_layers", 0) or 0)
        if n > 0:  # draft store only: not called by MiMoModel.forward (it runs model.layers)
            self.model.mtp_layers = nn.ModuleList(_MTPLayerStore(config) for _ in range(n))

    @property
    def num_mtp_layers(self) -> int:
        store = getattr(self.model, "mtp_layers", None)
        return 0 if store is None else len(store)

    def load_weights(self, weights):
        """MTP tensors go into the draft store; everything else to SGLang's loader unchanged (streamed). A
        labkit payload (the distributed path receives a bucket as one tensor named by its layout) goes to
        labkit's loader, which copies it by plan (and sends what it cannot map back here)."""
        if isinstance(weights, list) and apply.routes(weights):
            return apply.load_flat(self, weights)
        if fp.engine_armed("engine.apply"):  # `labkit faults`: a failure in the middle of an apply
            weights = with_failpoint(weights)
        return _SGLangMiMo.load_weights(self, self._divert_mtp(weights))

    def _divert_mtp(self, weights):
        for name, loaded in weights:
            if "mtp_layers" not in name:
                yield name, loaded
                continue
            self._load_mtp(name, loaded)

    def _load_mtp(self, name: str, loaded: torch.Tensor) -> None:
        if any(s in name for s in IGNORED):
            return
        m = _MTP_NAME.match(name)
        if m is None or int(m[1]) >= self.num_mtp_layers:
            raise ValueError(f"labkit MiMo: tensor {name!r} is not an MTP-layer weight this model holds "
                             f"(num_nextn_predict_layers={self.num_mtp_layers}; expected "
                             f"model.mtp_layers.{{i}}.<HF name>)")
        found = self.param_view(name)  # the store's slice for it: fused row block, true extent of a padded FFN
        if found is None:
            store_names = sorted(n for n, _ in self.model.mtp_layers[0].named_parameters())
            raise ValueError(f"labkit MiMo: unknown MTP tensor {name!r}; the draft store holds {store_names} per layer")
        dst = found[1]
        if tuple(loaded.shape) != tuple(dst.shape):  # copy_ would broadcast silently
            raise ValueError(f"labkit MiMo: MTP tensor {name!r} has shape {tuple(loaded.shape)}, the draft "
                             f"store expects {tuple(dst.shape)}")
        dst[...].copy_(loaded)


EntryClass = MiMoForCausalLM
