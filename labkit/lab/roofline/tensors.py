"""Every tensor a sync moves, from a model's config.json alone: HF names, shapes and dtypes, no weights, no torch.

The roofline (labkit.lab.roofline.bounds) needs what a sync of a real model would carry (bytes, tensor count, how the
planner cuts it into buckets) without downloading it. HF checkpoint naming is what SGLang's loaders receive, one
tensor per expert projection (transformers 5 fuses experts in memory; checkpoints and syncs do not), so tensor
counts here are the counts a per-tensor or bucketed sync pays for.

Families: deepseek_v3 (DeepSeek-V3, Kimi-K2, Moonlight: MLA with an optional q LoRA, first_k_dense_replace dense
layers, routed + shared experts, the router's e_score_correction_bias, MTP layers as model.layers.{L+k}),
qwen3_moe (q/k norm, experts on every decoder_sparse_step-th layer outside mlp_only_layers), qwen3, qwen2, llama
and labkit's mimo (a Qwen2 trunk + model.mtp_layers.{i}, named as labkit.models.tiny writes them).
`weights="fp8"` is DeepSeek's block FP8 as its checkpoints and FP8 rollouts hold it: every attention/MLP
projection in e4m3 (1 byte) plus a float32 `weight_scale_inv` per 128x128 block; embeddings, head, norms and
routers stay bf16. `count_buckets` cuts a list the way labkit's planner does, in one pass over ~140k tensors.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, get_args

from labkit.config import check
from labkit.engine.contract import plan_group
from labkit.sync.plan import TensorMeta
from labkit.models.real import REAL

Architecture = Literal["deepseek_v3", "qwen3_moe", "qwen3", "qwen2", "llama", "mimo"]
Weights = Literal["bf16", "fp8", "fp32"]
ARCHITECTURES = get_args(Architecture)
WEIGHTS = get_args(Weights)
ALIASES = {"kimi_k2": "deepseek_v3"}  # Kimi-K2's config.json says kimi_k2 over DeepseekV3ForCausalLM
LABKIT_SIZES = ("tiny", "quick", "bench")  # labkit.models.tiny.SIZES: the family labkit's benches sync
FP8_BLOCK = 128
_DTYPE = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class ModelTensors:
    """A model's tensors as one sync carries them."""

    label: str
    """Where the config came from (a shipped name, a path)."""
    architecture: str
    """The family its names follow (one of ARCHITECTURES)."""
    weights: str
    """bf16, fp8 (block FP8 projections + scales) or fp32."""
    mtp_layers: int
    """MTP layers counted (0 when the model has none or mtp=False)."""
    tensors: tuple[TensorMeta, ...]
    """In export order: the planner packs greedily in this order."""

    @functools.cached_property  # sums over up to ~140k tensors, asked for by every table
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @functools.cached_property
    def params(self) -> int:
        """Parameters (elements of every tensor but the FP8 scales), the number a model card quotes."""
        return sum(math.prod(t.shape) for t in self.tensors if not t.name.endswith("_scale_inv"))

    @functools.cached_property
    def expert_tensors(self) -> int:
        return sum(".mlp.experts." in t.name for t in self.tensors)


def names() -> tuple[str, ...]:
    """The model names `model_tensors` knows without a path."""
    return (*REAL, *LABKIT_SIZES)


def load_config(model: str | Path | dict) -> tuple[str, dict]:
    """(label, config dict) of a shipped name, a config.json path, a model directory, or a dict."""
    if isinstance(model, dict):
        return str(model.get("_name", "config")), model
    if str(model) in REAL:
        return REAL[str(model)]["_name"], REAL[str(model)]
    if str(model) in LABKIT_SIZES:
        from labkit.models import tiny

        spec = tiny.SIZES[str(model)]
        cfg = json.loads((tiny.DEFAULT_DIR / "config.json").read_text()) if spec is None else tiny.hf_config(spec)
        return f"labkit {model} MiMo", cfg
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"model={str(model)!r} is invalid: expected one of {', '.join(names())}, a config.json "
                         "path or a model directory")
    return str(model), json.loads(path.read_text())


def architecture(cfg: dict, where: str = "config") -> str:
    """The family a config's tensors are named by; a ValueError naming the model_type and the supported ones."""
    if "DeepseekV3ForCausalLM" in (cfg.get("architectures") or ()):
        return "deepseek_v3"
    mt = ALIASES.get(cfg.get("model_type"), cfg.get("model_type"))
    if mt not in ARCHITECTURES:
        raise ValueError(f"model_type={cfg.get('model_type')!r} in {where} is not supported by the roofline: "
                         f"expected one of {', '.join(ARCHITECTURES)} (or kimi_k2)")
    return mt


def model_tensors(model: str | Path | dict, weights: Weights = "bf16", mtp: bool = True) -> ModelTensors:
    """Every tensor of `model` (see `load_config`) as a sync would carry it in `weights`; `mtp=False` leaves MTP
    layers out (RL recipes that disable MTP, e.g. verl's DeepSeek-V3 one, do not sync them)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r} is invalid: expected one of {', '.join(WEIGHTS)}")
    if isinstance(model, str) and model in names():
        return _named(model, weights, bool(mtp))
    return _enumerate(model, weights, mtp)


@functools.lru_cache(maxsize=32)
def _named(model: str, weights: str, mtp: bool) -> ModelTensors:
    """Shipped configs never change within a process: enumerate each (model, weights, mtp) once."""
    return _enumerate(model, weights, mtp)


def _enumerate(model: str | Path | dict, weights: str, mtp: bool) -> ModelTensors:
    label, cfg = load_config(model)
    arch = architecture(cfg, label)
    n_mtp = int(cfg.get("num_nextn_predict_layers") or 0) if mtp else 0
    shapes = _deepseek(cfg, n_mtp) if arch == "deepseek_v3" else _dense_family(cfg, arch, n_mtp)
    return ModelTensors(label, arch, weights, n_mtp, tuple(_typed(shapes, weights)))


def _typed(shapes: list[tuple[str, tuple[int, ...]]], weights: str):
    dtype = _DTYPE[weights]
    for name, shape in shapes:
        if weights == "fp8" and _quantized(name, shape):
            yield TensorMeta(name, shape, "float8_e4m3fn")
            yield TensorMeta(name + "_scale_inv", tuple(-(-d // FP8_BLOCK) for d in shape), "float32")
        else:
            yield TensorMeta(name, shape, dtype)


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.endswith("_proj.weight") and (".self_attn." in name or ".mlp." in name)


def _head_dim(c: dict) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def _gqa(p: str, c: dict, bias: bool, qk_norm: bool) -> list:
    h, hd = c["hidden_size"], _head_dim(c)
    q, kv = c["num_attention_heads"] * hd, c.get("num_key_value_heads", c["num_attention_heads"]) * hd
    out = []
    for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        out.append((f"{p}.self_attn.{proj}.weight", (rows, h)))
        if bias:
            out.append((f"{p}.self_attn.{proj}.bias", (rows,)))
    out.append((f"{p}.self_attn.o_proj.weight", (h, q)))
    if qk_norm:
        out += [(f"{p}.self_attn.q_norm.weight", (hd,)), (f"{p}.self_attn.k_norm.weight", (hd,))]
    return out


def _mlp(p: str, h: int, ffn: int) -> list:
    return [(f"{p}.gate_proj.weight", (ffn, h)), (f"{p}.up_proj.weight", (ffn, h)), (f"{p}.down_proj.weight", (h, ffn))]


def _experts(p: str, h: int, ffn: int, n: int) -> list:
    return [x for j in range(n) for x in _mlp(f"{p}.mlp.experts.{j}", h, ffn)]


def _dense_family(c: dict, arch: str, n_mtp: int) -> list:
    """qwen2 / llama / qwen3 / qwen3_moe / mimo, in the order labkit.models.tiny writes a MiMo checkpoint."""
    h, bias = c["hidden_size"], c.get("attention_bias", arch in ("qwen2", "mimo"))
    qk_norm = arch in ("qwen3", "qwen3_moe")

    def layer(p: str, i: int) -> list:
        out = [(f"{p}.input_layernorm.weight", (h,)), *_gqa(p, c, bias, qk_norm),
               (f"{p}.post_attention_layernorm.weight", (h,))]
        if arch == "qwen3_moe" and _qwen_sparse(c, i):
            return out + [(f"{p}.mlp.gate.weight", (c["num_experts"], h)),
                          *_experts(p, h, c["moe_intermediate_size"], c["num_experts"])]
        return out + _mlp(f"{p}.mlp", h, c["intermediate_size"])

    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        out += layer(f"model.layers.{i}", i)
    out.append(("model.norm.weight", (h,)))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (c["vocab_size"], h)))
    if arch == "mimo":
        for i in range(n_mtp):
            p = f"model.mtp_layers.{i}"
            out += [(f"{p}.token_layernorm.weight", (h,)), (f"{p}.hidden_layernorm.weight", (h,)),
                    (f"{p}.input_proj.weight", (h, 2 * h)), (f"{p}.final_layernorm.weight", (h,)), *layer(p, 0)]
    return out


def _qwen_sparse(c: dict, i: int) -> bool:
    step = int(c.get("decoder_sparse_step", 1) or 1)
    return c.get("num_experts", 0) > 0 and i not in (c.get("mlp_only_layers") or ()) and (i + 1) % step == 0


def _mla(p: str, c: dict) -> list:
    h, heads, rope = c["hidden_size"], c["num_attention_heads"], c["qk_rope_head_dim"]
    qk, kvl = c["qk_nope_head_dim"] + rope, c["kv_lora_rank"]
    a = f"{p}.self_attn"
    if c.get("q_lora_rank"):
        ql = c["q_lora_rank"]
        out = [(f"{a}.q_a_proj.weight", (ql, h)), (f"{a}.q_a_layernorm.weight", (ql,)),
               (f"{a}.q_b_proj.weight", (heads * qk, ql))]
    else:
        out = [(f"{a}.q_proj.weight", (heads * qk, h))]
    return out + [(f"{a}.kv_a_proj_with_mqa.weight", (kvl + rope, h)), (f"{a}.kv_a_layernorm.weight", (kvl,)),
                  (f"{a}.kv_b_proj.weight", (heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), kvl)),
                  (f"{a}.o_proj.weight", (h, heads * c["v_head_dim"]))]


def _deepseek_layer(p: str, c: dict, i: int) -> list:
    h, n = c["hidden_size"], c.get("n_routed_experts") or 0
    out = [(f"{p}.input_layernorm.weight", (h,)), *_mla(p, c), (f"{p}.post_attention_layernorm.weight", (h,))]
    if not (n and i >= c.get("first_k_dense_replace", 0) and i % int(c.get("moe_layer_freq", 1) or 1) == 0):
        return out + _mlp(f"{p}.mlp", h, c["intermediate_size"])
    out.append((f"{p}.mlp.gate.weight", (n, h)))
    if c.get("topk_method") == "noaux_tc":
        out.append((f"{p}.mlp.gate.e_score_correction_bias", (n,)))
    out += _experts(p, h, c["moe_intermediate_size"], n)
    if c.get("n_shared_experts"):
        out += _mlp(f"{p}.mlp.shared_experts", h, c["moe_intermediate_size"] * c["n_shared_experts"])
    return out


def _deepseek(c: dict, n_mtp: int) -> list:
    """DeepSeek-V3 checkpoint naming; MTP layer k is model.layers.{L+k} with its own embedding and head copy."""
    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    out = [("model.embed_tokens.weight", (v, h))]
    for i in range(layers):
        out += _deepseek_layer(f"model.layers.{i}", c, i)
    out.append(("model.norm.weight", (h,)))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (v, h)))
    for k in range(n_mtp):
        p = f"model.layers.{layers + k}"
        out += [(f"{p}.embed_tokens.weight", (v, h)), (f"{p}.enorm.weight", (h,)), (f"{p}.hnorm.weight", (h,)),
                (f"{p}.eh_proj.weight", (h, 2 * h)), *_deepseek_layer(p, c, layers + k),
                (f"{p}.shared_head.norm.weight", (h,)), (f"{p}.shared_head.head.weight", (v, h))]
    return out


def count_buckets(tensors: Iterable[TensorMeta], bucket_bytes: int) -> int:
    """How many buckets labkit's planner (labkit.sync.plan.plan_buckets) cuts `tensors` into, in one pass:
    the same greedy, order-preserving packing of fused groups, a group larger than a bucket alone."""
    check(isinstance(bucket_bytes, int) and not isinstance(bucket_bytes, bool) and bucket_bytes > 0,
          "bucket_bytes", bucket_bytes, "a positive integer number of bytes")
    sizes: dict[str, int] = {}
    seen: set[str] = set()
    for t in tensors:
        if t.name not in seen:  # duplicates are dropped, as the planner drops them
            seen.add(t.name)
            key = plan_group(t.name)
            sizes[key] = sizes.get(key, 0) + t.nbytes
    n, held, cur = 0, False, 0
    for size in sizes.values():
        if size > bucket_bytes:
            n, held, cur = n + held + 1, False, 0
        elif held and cur + size > bucket_bytes:
            n, cur = n + 1, size
        else:
            held, cur = True, cur + size
    return n + held


def largest_group_bytes(tensors: Iterable[TensorMeta]) -> int:
    """The largest fused group (the planner keeps one in one bucket): buckets smaller than it hold oversize
    groups that travel alone in fresh buffers, a cost of another kind than a bucket's."""
    sizes: dict[str, int] = {}
    for t in {t.name: t for t in tensors}.values():
        key = plan_group(t.name)
        sizes[key] = sizes.get(key, 0) + t.nbytes
    return max(sizes.values(), default=0)

