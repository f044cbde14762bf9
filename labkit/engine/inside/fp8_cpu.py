"""A compat layer: block-FP8 serving on SGLang 0.5.23's CPU engine without AMX, the checkpoint layout kept.

SGLang serves a block-FP8 checkpoint on CPU only through AMX kernels: `Fp8LinearMethod` and `Fp8MoEMethod`
assert AMX after load (`layers/quantization/fp8.py:826-833`, `:2184-2188`) and repack the weights for it; past
the assert, the linear falls through to a Triton kernel (`fp8.py:1427`: "0 active drivers"). SGLang has no
torch-native FP8 path, so this layer is one, switched on where CUDA is absent and AMX is too:

- after load (and after every weight update, which re-runs the post-load step) the fp8 weights and their
  `weight_scale_inv` stay as the checkpoint lays them out: the parameters labkit's copy plan writes into and its
  checksums read are the checkpoint's bytes, no repacked copy;
- `apply` dequantizes blockwise (labkit.models.fp8.dequantize, fp32, then the activation dtype) and calls
  `F.linear`; the MoE layer dequantizes its stacked `w13_weight` / `w2_weight` and runs SGLang's own
  `moe_forward_native`;
- DeepSeek's absorbed MLA derives `w_kc` / `w_vc` from `kv_b_proj` after load. For 128 x 128 blocks on CUDA and
  XPU SGLang dequantizes them blockwise to bf16, or keeps the blocks for DeepGEMM's bmm
  (`models/deepseek_common/deepseek_weight_loader.py:690-708`); elsewhere it requantizes them per tensor
  (`:709-713`, `block_quant_to_tensor_quant`), a second rounding no GPU engine makes, and greedy output parts
  from that of the bf16 dequantization (tests/integration/test_fp8.py). Here the derivation takes the GPU's
  bf16 branch.

No dequantized copy is cached: labkit's copy plan writes the parameters in place without SGLang's post-load
step, so a cache would serve the weights of the sync before (NeMo-RL #3739, derived weights never refreshed).
The price is a dequantization per forward, which a tiny CPU model does not feel. On a GPU SGLang's own kernels
run (DeepGEMM, with UE8M0 requantized scales) and this layer is off.
"""

from __future__ import annotations

from types import SimpleNamespace

_applied = False


def needed() -> bool:
    import torch

    return not torch.cuda.is_available()


def apply() -> bool:
    """Patch SGLang's block-FP8 methods in this process (the scheduler's); idempotent. False where not needed:
    on a GPU, or on a CPU where SGLang's AMX kernels are there to run."""
    global _applied
    if _applied:
        return True
    if not needed():
        return False
    from labkit.compat import check_version

    check_version("sglang")
    from sglang.srt.layers.quantization import fp8 as f

    if f._is_cpu_amx_available:
        return False

    _patch_linear(f.Fp8LinearMethod)
    _patch_moe(f.Fp8MoEMethod)
    _patch_mla_derivation()
    _applied = True
    return True


def _block(method) -> tuple[int, int]:
    return tuple(method.quant_config.weight_block_size)


def _patch_linear(cls) -> None:
    import torch.nn.functional as F

    from labkit.models.fp8 import dequantize

    apply_before = cls.apply

    def process_weights_after_loading_block_quant(self, layer) -> None:
        return None  # the checkpoint layout stays: fp8 weight [N, K], float32 weight_scale_inv [N/bn, K/bk]

    def apply(self, layer, x, bias=None):
        if not self.block_quant:
            return apply_before(self, layer, x, bias)
        w = dequantize(layer.weight, layer.weight_scale_inv, _block(self), dtype=x.dtype)
        return F.linear(x, w, bias)

    cls.process_weights_after_loading_block_quant = process_weights_after_loading_block_quant
    cls.apply = apply


def _patch_moe(cls) -> None:
    from labkit.models.fp8 import dequantize

    apply_before = cls.apply

    def process_weights_after_loading_block_quant(self, layer) -> None:
        return None  # w13_weight [E, 2I, H] and w2_weight [E, H, I] in fp8, their scales beside them, unpacked

    def apply(self, layer, dispatch_output):
        if not self.block_quant:
            return apply_before(self, layer, dispatch_output)
        from sglang.srt.layers.moe.fused_moe_native import moe_forward_native
        from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

        x = dispatch_output.hidden_states
        dense = SimpleNamespace(
            num_experts=layer.num_experts,
            w13_weight=dequantize(layer.w13_weight, layer.w13_weight_scale_inv, _block(self), dtype=x.dtype),
            w2_weight=dequantize(layer.w2_weight, layer.w2_weight_scale_inv, _block(self), dtype=x.dtype),
            w13_weight_bias=getattr(layer, "w13_weight_bias", None),
            w2_weight_bias=getattr(layer, "w2_weight_bias", None))
        out = moe_forward_native(dense, x, dispatch_output.topk_output, self.moe_runner_config)
        return StandardCombineInput(hidden_states=out)

    cls.process_weights_after_loading_block_quant = process_weights_after_loading_block_quant
    cls.apply = apply


def _patch_mla_derivation() -> None:
    import torch
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant
    from sglang.srt.models.deepseek_common import deepseek_weight_loader as loader

    def dequantized(weight, scale, block):
        # (weight, per-tensor scale) as the caller expects; a bf16 weight takes the forward's bf16 bmm, which
        # never reads the scale
        return block_quant_dequant(weight, scale, block, torch.bfloat16), torch.ones((), dtype=torch.float32)

    loader.block_quant_to_tensor_quant = dequantized
