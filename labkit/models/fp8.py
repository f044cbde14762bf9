"""Blockwise FP8 weights: what a block-FP8 checkpoint holds, and the one recipe that makes a weight into one.

The format is DeepSeek-V3's, which SGLang's `Fp8Config` reads (`quant_method: fp8`, `weight_block_size: [128,
128]`): a linear layer's weight `[N, K]` in float8_e4m3fn beside `weight_scale_inv` `[ceil(N/128), ceil(K/128)]`
in float32, the weight being `q * scale` block by block ("inv": the checkpoint stores the multiplier that undoes
the division). The recipe is fixed, because verification compares bytes: the engine must hold exactly what the
trainer's quantization of its export gives, and two recipes (SGLang's own rounds `x * (448 / amax)`) differ in
the last bit. Per 128 x 128 block, `scale = amax / 448` in float32 (a zero block: 1), optionally rounded up to a
power of two (UE8M0: engines whose kernels take exponent-only scales, DeepGEMM), then `q = (w / scale)`
clamped to +-448 and cast to e4m3.

What stays in the serving dtype is declared here, not guessed from names at the call site (the field's silent
failures: gate/up left in bf16 by a substring match, verl #7519; routers quantized, NeMo-RL #3614): `quantizable`
keeps embeddings, lm_head, every norm (q/k norms too), MoE routers and DeepSeek's `e_score_correction_bias`,
and whatever the checkpoint lists in `modules_to_not_convert` / `ignored_layers`. A sync never re-decides it: it
quantizes what the engine's checkpoint holds in fp8 (labkit.sync.quantize).
"""

from __future__ import annotations

import math
import re

E4M3 = "float8_e4m3fn"
E4M3_MAX = 448.0
BLOCK = (128, 128)
SCALE_SUFFIX = "_scale_inv"  # `x.weight` -> `x.weight_scale_inv`
# Never quantized: vocabulary tables, norms, routers (Qwen3-MoE and DeepSeek `mlp.gate` + its bias, Qwen2-MoE's
# `shared_expert_gate`).
_KEEP = re.compile(r"(^|\.)(embed_tokens|lm_head|[a-z_]*norm|[a-z_]*gate|e_score_correction_bias)(\.|$)")


def scale_name(weight: str) -> str:
    """The scale that travels with quantized weight `weight` (`....weight` -> `....weight_scale_inv`)."""
    if not weight.endswith(".weight"):
        raise ValueError(f"{weight!r}: only a `.weight` tensor has a block scale")
    return weight + SCALE_SUFFIX


def weight_of(name: str) -> str | None:
    """The weight a scale belongs to (`....weight_scale_inv` -> `....weight`); None for any other name."""
    return name[: -len(SCALE_SUFFIX)] if name.endswith(".weight" + SCALE_SUFFIX) else None


def quantizable(name: str, shape: tuple[int, ...], not_converted: tuple[str, ...] = ()) -> bool:
    """Whether a block-FP8 checkpoint holds HF tensor `name` in fp8: a 2-D linear `.weight` that is not a
    vocabulary table, a norm or a router, and not under a module the checkpoint keeps unconverted."""
    if not name.endswith(".weight") or len(shape) != 2 or _KEEP.search(name[: -len(".weight")]):
        return False
    return not any(m and (name.startswith(m + ".") or f".{m}." in f".{name}") for m in not_converted)


def config_entry(block: tuple[int, int] = BLOCK, pow2_scales: bool = False) -> dict:
    """config.json's `quantization_config` of a checkpoint written with this recipe (SGLang's Fp8Config reads
    it; `scale_fmt: ue8m0` marks power-of-two scales)."""
    out = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    return out | ({"scale_fmt": "ue8m0"} if pow2_scales else {})


def recipe_of(config: dict) -> dict | None:
    """{"block": (bn, bk), "pow2_scales": bool, "not_converted": (...)} of a block-FP8 config.json, None for
    an unquantized one; another quantization is refused by name (labkit syncs block FP8 only)."""
    q = config.get("quantization_config")
    if not q:
        return None
    method, block = q.get("quant_method"), q.get("weight_block_size")
    if method != "fp8" or not block or len(block) != 2:
        raise ValueError(f"quantization_config={q!r}: labkit syncs block FP8 only (quant_method 'fp8' with "
                         "weight_block_size [n, k])")
    skip = tuple(q.get("modules_to_not_convert") or ()) + tuple(q.get("ignored_layers") or ())
    return {"block": (int(block[0]), int(block[1])), "pow2_scales": q.get("scale_fmt") == "ue8m0",
            "not_converted": skip}


def scale_shape(shape: tuple[int, ...], block: tuple[int, int] = BLOCK) -> tuple[int, int]:
    return (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))


def quantize(w, block: tuple[int, int] = BLOCK, pow2_scales: bool = False):
    """(q float8_e4m3fn [N, K], scale float32 [ceil(N/bn), ceil(K/bk)]) of a 2-D weight, by the recipe above.
    Deterministic: the same input gives the same bytes, on any device."""
    import torch

    if w.dim() != 2:
        raise ValueError(f"block FP8 quantizes 2-D weights, got shape {tuple(w.shape)}")
    n, k = w.shape
    sn, sk = scale_shape((n, k), block)
    x = w.detach().to(torch.float32)
    padded = torch.zeros(sn * block[0], sk * block[1], dtype=torch.float32, device=x.device)
    padded[:n, :k] = x
    blocks = padded.view(sn, block[0], sk, block[1])
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    if pow2_scales:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).view_as(padded)[:n, :k]
    return q.to(getattr(torch, E4M3)).contiguous(), scale.contiguous()


def dequantize(q, scale, block: tuple[int, int] = BLOCK, dtype=None):
    """The weight a (q, scale) pair stands for: each block of q times its scale, in float32 (or `dtype`). Over
    the last two dimensions, so stacked experts ([E, N, K] with [E, N/bn, K/bk] scales) dequantize at once."""
    import torch

    n, k = q.shape[-2:]
    full = scale.to(torch.float32).repeat_interleave(block[0], -2)[..., :n, :]
    full = full.repeat_interleave(block[1], -1)[..., :k]
    w = q.to(torch.float32) * full
    return w if dtype is None else w.to(dtype)


def quantize_checkpoint(named: dict, recipe: dict, dtype: str = "bfloat16") -> dict:
    """A block-FP8 checkpoint's tensors from unquantized HF ones: each `quantizable` weight as (fp8, scale),
    everything else in the serving `dtype`."""
    import torch

    out = {}
    for name, t in named.items():
        if quantizable(name, tuple(t.shape), recipe["not_converted"]):
            out[name], out[scale_name(name)] = quantize(t, recipe["block"], recipe["pow2_scales"])
        else:
            out[name] = t.to(getattr(torch, dtype))
    return out


def write_checkpoint(src_dir, out_dir, block: tuple[int, int] = BLOCK, pow2_scales: bool = False):
    """The block-FP8 twin of HF model directory `src_dir` in `out_dir`: its config with `quantization_config`
    and dtype bfloat16 (FP8 serves with bf16 activations: SGLang refuses float32), its weights through
    `quantize_checkpoint`, every other file copied. Returns the path."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    src, out = Path(src_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    config = json.loads((src / "config.json").read_text())
    config.update(quantization_config=config_entry(block, pow2_scales), torch_dtype="bfloat16", dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    named = {}
    for f in sorted(src.glob("*.safetensors")):
        named.update(load_file(str(f)))
    save_file(quantize_checkpoint(named, recipe_of(config)), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


MASTER = "bf16"  # the subdirectory of an FP8 model dir that holds its unquantized original (a trainer's weights)


def master_dir(model_dir) -> tuple[str, bool]:
    """(the model dir a trainer loads, whether `model_dir` is block-FP8). A trainer holds unquantized weights:
    for an FP8 checkpoint, its original in `MASTER` beside it (labkit's FP8 presets write one); an FP8 checkpoint
    without one is refused, naming what is missing, rather than trained from fp8 bytes."""
    import json
    from pathlib import Path

    d = Path(model_dir)
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    if recipe_of(config) is None:
        return str(d), False
    if not (d / MASTER / "config.json").is_file():
        raise FileNotFoundError(f"model_dir={str(model_dir)!r} is a block-FP8 checkpoint without its unquantized "
                                f"original in {str(d / MASTER)!r}: a trainer holds bf16 or fp32 weights and "
                                "quantizes them on the way to the engine")
    return str(d / MASTER), True
