"""SGLang's DeepseekV3ForCausalLM (MLA + MoE) with labkit's weight access (`weights.LabkitWeights`), plus:

- MLA's low-rank pair: SGLang fuses `q_a_proj` and `kv_a_proj_with_mqa` into `fused_qkv_a_proj_with_mqa`
  ([q_lora | kv_lora + rope] rows of a ReplicatedLinear, which has no `output_sizes`): the copy plan's views
  come from the config here. Its own loader writes the pair only when both arrive in one call (a two-call
  update answers Success for both and never writes the weight), which the bucket planner prevents
  (labkit.engine.contract: one plan group).
- Derived copies: the absorbed MLA forward reads `w_kc` / `w_vc`, split from `kv_b_proj` by `post_load_weights`,
  which SGLang's `load_weights` runs at its end and a weight update through labkit's copy plan would not: the
  checksums would verify while generation kept the old `kv_b_proj`. `labkit_after_apply` runs it for the layers
  whose kv_b_proj a bucket changed.
- On a CPU engine, SGLang's MLA backend registry has no `torch_native` entry and falls back to triton's choice
  (plain MHA for a fresh prefill), while the torch_native backend reads K/V from the MLA latent cache: the first
  generate dies with "Expected size for first two dimensions of batch2 tensor to be: [4, 24] but got: [4, 40]".
  The absorbed MLA path is registered for it (this module is imported in the scheduler, with the model package).
"""

import torch
from sglang.srt.models.deepseek_common import attention_backend_handler as _backends
from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM as _SGLangDeepseekV3

from labkit.engine.contract import MLA_PLAIN, fused_part
from labkit.engine.inside.sglang_models.weights import SCALE, LabkitWeights

A_PAIR = "fused_qkv_a_proj_with_mqa.weight"

if not torch.cuda.is_available() and "torch_native" not in _backends.AttentionBackendRegistry._handlers:
    _backends.AttentionBackendRegistry.register("torch_native", _backends._dispatch_mla_subtype)


class DeepseekV3ForCausalLM(LabkitWeights, _SGLangDeepseekV3):
    def labkit_fused_part(self, name: str):
        """Without a q LoRA (Moonlight) SGLang keeps `q_proj` and `kv_a_proj_with_mqa` as parameters of their own."""
        if not self.config.q_lora_rank and name.split(".")[-2] in MLA_PLAIN:
            return None
        return fused_part(name)

    def param_view(self, name: str):
        part = self.labkit_fused_part(name)
        if part is None or not part[0].endswith((A_PAIR, A_PAIR + SCALE)):
            return super().param_view(name)
        weight = self.get_parameter(part[0]).data
        q = self.config.q_lora_rank
        if part[0].endswith(SCALE):  # block-FP8: a scale row per block of rows (q_lora_rank a multiple of it)
            q //= self._scale_block()
        return part[0], (weight[:q] if part[1] == 0 else weight[q:])

    def labkit_after_apply(self, names: list[str]) -> None:
        """Called by labkit.engine.inside.apply after a bucket was copied in: re-derive what SGLang derives at load."""
        kv_b = [n for n in names if "kv_b_proj" in n]
        if kv_b:
            self.post_load_weights(weight_names=kv_b)


EntryClass = DeepseekV3ForCausalLM
