"""SGLang's Qwen3ForCausalLM (dense: q/k norms, no qkv bias) with labkit's weight access (`weights.LabkitWeights`):
the copy plan's views into its fused qkv_proj / gate_up_proj, and the distributed path's payloads routed to
labkit's loader (SGLang's own class would take a labkit payload for a tensor name and refuse it)."""

from sglang.srt.models.qwen3 import Qwen3ForCausalLM as _SGLangQwen3

from labkit.engine.inside.sglang_models.weights import LabkitWeights


class Qwen3ForCausalLM(LabkitWeights, _SGLangQwen3):
    pass


EntryClass = Qwen3ForCausalLM
