"""SGLang's MiMoForCausalLM plus `get_weights_by_name` (0.5.23's MiMo lacks it; Llama has it).

Without it `Engine.get_weights_by_name` answers None for every MiMo tensor, and bitwise weight-sync
checks have nothing to read. The reply follows SGLang's convention (Llama's): the tensor converted to
float32 (exact for fp32/bf16/fp16) as a nested list, truncated to `truncate_size` rows, so it passes
the scheduler's msgspec output struct and HTTP JSON unchanged. Names are HF names; fused
qkv_proj / gate_up_proj are sliced back into q/k/v and gate/up. TP=1 only (what a CPU engine runs).
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.models.mimo import MiMoForCausalLM as _SGLangMiMo

logger = logging.getLogger(__name__)

# HF shard name -> (fused SGLang name, shard index in the fused output dim)
_STACKED = (("q_proj", "qkv_proj", 0), ("k_proj", "qkv_proj", 1), ("v_proj", "qkv_proj", 2),
            ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1))


def _shard_sizes(module) -> list[int]:
    if hasattr(module, "q_proj_shard_size"):  # QKVParallelLinear, per-rank sizes
        return [module.q_proj_shard_size, module.kv_proj_shard_size, module.v_proj_shard_size]
    return list(module.output_sizes)  # MergedColumnParallelLinear (TP=1: full sizes)


class MiMoForCausalLM(_SGLangMiMo):
    def get_weights_by_name(self, name: str, truncate_size: int = 100, tp_size: int = 1):
        try:
            if tp_size != 1:
                raise NotImplementedError(f"labkit's MiMo get_weights_by_name reads TP=1 engines only (tp_size={tp_size})")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                name = "model.embed_tokens.weight"
            params = dict(self.named_parameters())
            weight = None
            for hf, fused, idx in _STACKED:
                part = f".{hf}."
                if part in name:
                    fused_name = name.replace(part, f".{fused}.")
                    module = self.get_submodule(fused_name.rsplit(".", 1)[0])
                    sizes = _shard_sizes(module)
                    weight = params[fused_name].data.narrow(0, sum(sizes[:idx]), sizes[idx])
                    break
            if weight is None:
                weight = params[name].data
                owner = self.get_submodule(name.rsplit(".", 1)[0])
                org = getattr(owner, "org_vocab_size", None)  # vocab-parallel tables are padded
                if org is not None and weight.shape[0] > org:
                    weight = weight[:org]
            return weight.detach().cpu().to(torch.float32).numpy().tolist()[:truncate_size]
        except Exception as e:  # SGLang's contract: log and answer None
            logger.error(f"labkit MiMo get_weights_by_name({name!r}) failed: {type(e).__name__}: {e}")
            return None


EntryClass = MiMoForCausalLM
