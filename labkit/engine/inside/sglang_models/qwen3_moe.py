"""SGLang's Qwen3MoeForCausalLM with labkit's weight access (`weights.LabkitWeights`): reading back by HF name,
including each expert's slice of FusedMoE's `w13_weight` / `w2_weight`; the copy plan's views; payload routing.
The forward is SGLang's own (on CPU its torch-native MoE path: `fused_topk_torch_native`, `moe_forward_native`)."""

from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM as _SGLangQwen3Moe

from labkit.engine.inside.sglang_models.weights import LabkitWeights


class Qwen3MoeForCausalLM(LabkitWeights, _SGLangQwen3Moe):
    pass


EntryClass = Qwen3MoeForCausalLM
