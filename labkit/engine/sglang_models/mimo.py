"""SGLang's MiMoForCausalLM plus `get_weights_by_name` and an MTP draft-weight store.

`get_weights_by_name`: 0.5.23's MiMo lacks it (Llama has it); without it `Engine.get_weights_by_name` answers
None for every MiMo tensor, and bitwise weight-sync checks have nothing to read. The reply follows SGLang's
convention (Llama's): the tensor converted to float32 (exact for fp32/bf16/fp16) as a nested list, truncated
to `truncate_size` rows, so it passes the scheduler's msgspec output struct and HTTP JSON unchanged. Names are
HF names; fused qkv_proj / gate_up_proj are sliced back into q/k/v and gate/up. TP=1 only (what a CPU engine
runs).

MTP draft store: SGLang's target model skips `model.mtp_layers.*` (only a speculative draft worker, MiMoMTP,
loads them), and a CPU engine cannot speculate, so no engine process would hold the MTP weights. labkit's
weight sync still sends them with every sync and verifies them bitwise on the engine, and labkit's CPU
speculative-decoding loop reads them back. So the target model keeps them as plain parameters under
`model.mtp_layers.{i}` in SGLang's own layout (q/k/v fused into `self_attn.qkv_proj`, gate/up into
`mlp.gate_up_proj`), where SGLang's weight checker (`check_weights("checksum")`, over `named_parameters()`)
and `get_weights_by_name` see them. The store never runs in forward; on GPU with `speculative_algorithm` the
real draft worker (MiMoMTP) loads and runs its own copy, and this store is an unused duplicate.
"""

from __future__ import annotations

import logging
import re

import torch
from sglang.srt.models.mimo import MiMoForCausalLM as _SGLangMiMo
from torch import nn

from labkit import failpoints as fp
from labkit.engine import apply
from labkit.engine.contract import fused_part

logger = logging.getLogger(__name__)

_MTP_NAME = re.compile(r"^model\.mtp_layers\.(\d+)\.(.+)$")
# checkpoint leftovers SGLang's own loaders skip everywhere
_IGNORED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def _shard_sizes(module) -> list[int]:
    if hasattr(module, "q_proj_shard_size"):  # QKVParallelLinear, per-rank sizes
        return [module.q_proj_shard_size, module.kv_proj_shard_size, module.v_proj_shard_size]
    return list(module.output_sizes)  # MergedColumnParallelLinear (TP=1: full sizes), or a _Weights below


class _Weights(nn.Module):
    """Parameters only (no forward). `output_sizes`: the row blocks of a fused projection, like SGLang's
    merged linears, so shard names resolve the same way for the trunk and the store. dtype/device come from
    the loader's defaults (set_default_torch_dtype + device context), as for SGLang's own layers."""

    def __init__(self, shape: tuple[int, ...], output_sizes: list[int] | None = None, bias: bool = False):
        super().__init__()
        self.output_sizes = list(output_sizes or [shape[0]])
        assert sum(self.output_sizes) == shape[0], (shape, self.output_sizes)
        dtype = torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(shape[0], dtype=dtype), requires_grad=False)


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


class MiMoForCausalLM(_SGLangMiMo):
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
            weights = _with_failpoint(weights)
        return super().load_weights(self._divert_mtp(weights))

    def _divert_mtp(self, weights):
        store = None
        for name, loaded in weights:
            if "mtp_layers" not in name:
                yield name, loaded
                continue
            if store is None:
                store = dict(self.model.mtp_layers.named_parameters(prefix="model.mtp_layers")) \
                    if self.num_mtp_layers else {}
            self._load_mtp(store, name, loaded)

    def _load_mtp(self, store: dict, name: str, loaded: torch.Tensor) -> None:
        if any(s in name for s in _IGNORED):
            return
        m = _MTP_NAME.match(name)
        if m is None or int(m[1]) >= self.num_mtp_layers:
            raise ValueError(f"labkit MiMo: tensor {name!r} is not an MTP-layer weight this model holds "
                             f"(num_nextn_predict_layers={self.num_mtp_layers}; expected "
                             f"model.mtp_layers.{{i}}.<HF name>)")
        part = fused_part(name)  # HF shard -> (fused SGLang name, shard index in the fused output dim)
        target, idx = (name, None) if part is None else part[:2]
        param = store.get(target)
        if param is None:
            raise ValueError(f"labkit MiMo: unknown MTP tensor {name!r}; the draft store holds "
                             f"{sorted({_MTP_NAME.match(p)[2] for p in store})} per layer")
        dst = param.data
        if idx is not None:
            sizes = _shard_sizes(self.get_submodule(target.rsplit(".", 1)[0]))
            dst = dst.narrow(0, sum(sizes[:idx]), sizes[idx])
        if tuple(loaded.shape) != tuple(dst.shape):  # copy_ would broadcast silently
            raise ValueError(f"labkit MiMo: MTP tensor {name!r} has shape {tuple(loaded.shape)}, the draft "
                             f"store expects {tuple(dst.shape)}")
        dst[...].copy_(loaded)

    def param_view(self, name: str) -> tuple[str, torch.Tensor] | None:
        """(engine parameter name, the slice of it that holds HF tensor `name`) on a TP=1 engine, or None when
        `name` is not a plain copy into one (labkit.engine.apply then uses `load_weights`). Fused q/k/v and
        gate/up resolve to their row block (the store's fused modules carry `output_sizes` too); vocab tables
        to their unpadded rows. A tied lm_head is SGLang's loader's to skip."""
        if any(s in name for s in _IGNORED) or (name == "lm_head.weight" and self.config.tie_word_embeddings):
            return None
        part = fused_part(name)
        target = name if part is None else part[0]
        try:
            weight = self.get_parameter(target).data
        except AttributeError:
            return None
        owner = self.get_submodule(target.rsplit(".", 1)[0])
        if part is not None:
            sizes = _shard_sizes(owner)
            return target, weight.narrow(0, sum(sizes[:part[1]]), sizes[part[1]])
        org = getattr(owner, "org_vocab_size", None)  # vocab-parallel tables are padded
        return target, (weight[:org] if org is not None and weight.shape[0] > org else weight)

    def get_weights_by_name(self, name: str, truncate_size: int = 100, tp_size: int = 1):
        # MTP names resolve like the trunk's: the store's fused modules carry `output_sizes`.
        if name == apply.STATS_NAME:
            return [apply.end_sync()]
        try:
            if tp_size != 1:
                raise NotImplementedError(f"labkit's MiMo get_weights_by_name reads TP=1 engines only "
                                          f"(tp_size={tp_size})")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                name = "model.embed_tokens.weight"
            found = self.param_view(name)
            if found is None:
                raise KeyError(name)
            return found[1].detach().cpu().to(torch.float32).numpy().tolist()[:truncate_size]
        except Exception as e:  # SGLang's contract: log and answer None
            logger.error(f"labkit MiMo get_weights_by_name({name!r}) failed: {type(e).__name__}: {e}")
            return None


def _with_failpoint(weights):
    for name, t in weights:  # SGLang's loader writes each tensor before it pulls the next
        fp.hit("engine.apply", name=name)
        yield name, t


EntryClass = MiMoForCausalLM
