"""Tiny random checkpoints of real model families: Qwen3 (dense), Qwen3-MoE and DeepSeek-V3 (MLA + MoE).

A weight sync meets each family's own layout: q/k norms (Qwen3), hundreds of per-expert tensors that an
engine fuses into `w13`/`w2` (MoE), MLA's low-rank projections that an engine fuses across two HF tensors
(DeepSeek-V3). So each directory here holds exactly what a real checkpoint of that family holds: config.json
written by the transformers config class, HF checkpoint names (per expert), labkit's char tokenizer (so
`labkit.tasks.ArithTask` runs on every family) and random weights fixed by the spec's seed. The tensors are
written directly (no HF model is built), so even the 4,000-tensor preset takes a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.config import _int, check
from labkit.models.tokenizer import BOS, EOS, PAD, VOCAB, save_char_tokenizer

FAMILIES = ("qwen3", "qwen3-moe", "deepseek-v3")
# config.json's model_type -> family name (mimo: labkit.models.tiny).
MODEL_TYPES = {"mimo": "mimo", "qwen3": "qwen3", "qwen3_moe": "qwen3-moe", "deepseek_v3": "deepseek-v3"}
ROPE_THETA = 10000.0
INIT_STD = 0.2  # large enough that greedy output depends on the prompt (0.02 gives one token for every prompt)


@dataclass(kw_only=True, slots=True, frozen=True)
class FamilySpec:
    """Sizes of one family's tiny model. A field that a family has no use for is ignored by it."""

    vocab: int = 128
    """Embedding rows: at least the char tokenizer's 100 entries; need not be a multiple of 64."""
    hidden: int = 64
    """Hidden size."""
    layers: int = 2
    """Transformer layers."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int = 2
    """Key/value heads (GQA; a divisor of heads). DeepSeek-V3's MLA uses heads instead."""
    head_dim: int = 16
    """Per-head size (Qwen: q/k/v; DeepSeek-V3: the no-RoPE part of q/k, and v)."""
    ffn: int = 128
    """Intermediate size of a dense MLP (every qwen3 layer, the dense layers of the MoE families)."""
    experts: int = 8
    """Routed experts per MoE layer."""
    top_k: int = 2
    """Experts each token is routed to (at most experts)."""
    moe_ffn: int = 32
    """Intermediate size of one expert (and of each DeepSeek-V3 shared expert)."""
    shared_experts: int = 1
    """DeepSeek-V3: shared experts every token goes through (one MLP of moe_ffn * shared_experts)."""
    dense_layers: int = 0
    """MoE families: the first layers that have a dense MLP instead (DeepSeek-V3's first_k_dense_replace)."""
    q_lora: int = 32
    """DeepSeek-V3: rank of q's low-rank projection (q_lora_rank)."""
    kv_lora: int = 32
    """DeepSeek-V3: rank of the compressed KV (kv_lora_rank)."""
    rope_head_dim: int = 8
    """DeepSeek-V3: per-head size of the RoPE part of q/k (qk_rope_head_dim; even)."""
    max_positions: int = 256
    """Longest sequence the RoPE tables cover."""
    seed: int = 0
    """Initialisation seed: the same seed writes a bitwise-identical model.safetensors."""

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "experts", "top_k", "moe_ffn",
                  "shared_experts", "q_lora", "kv_lora", "rope_head_dim", "max_positions"):
            _int(f, getattr(self, f))
        _int("vocab", self.vocab, lo=len(VOCAB))
        _int("dense_layers", self.dense_layers, lo=0)
        _int("seed", self.seed, lo=0)
        check(self.heads % self.kv_heads == 0, "kv_heads", self.kv_heads, f"a divisor of heads={self.heads}")
        check(self.top_k <= self.experts, "top_k", self.top_k, f"at most experts={self.experts}")
        check(self.dense_layers < self.layers, "dense_layers", self.dense_layers, f"less than layers={self.layers}")
        check(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even integer (RoPE rotates pairs)")
        check(self.rope_head_dim % 2 == 0, "rope_head_dim", self.rope_head_dim, "an even integer (RoPE rotates pairs)")


# name -> (family, spec). `qwen3-moe` is a checkpoint of 4,179 tensors (16 layers x 84 experts x 3; Qwen3-30B-A3B
# has 18,867) holding 300 MB in fp32, within 6 % of the dense bench model's 317 MB (labkit.models.tiny.BENCH_SPEC,
# 307 tensors): the two differ in tensor count, not in bytes, so `labkit bench sync --model qwen3-moe` measures
# what the count costs a sync (at 9 MB, an earlier size, fixed per-sync costs set its GB/s instead). Its expert
# width 96 is a multiple of 32, as real checkpoints' are, so a CPU engine does not pad it. The others are at the
# tiny default sizes (`qwen3-moe-tiny`: 69 tensors, for tests; the integration tests pad an expert width of 16).
FAMILY_SIZES: dict[str, tuple[str, FamilySpec]] = {
    "qwen3": ("qwen3", FamilySpec()),
    "qwen3-moe": ("qwen3-moe", FamilySpec(hidden=192, layers=16, heads=4, kv_heads=2, head_dim=8, ffn=64,
                                          experts=84, moe_ffn=96)),
    "qwen3-moe-tiny": ("qwen3-moe", FamilySpec()),
    "deepseek-v3": ("deepseek-v3", FamilySpec(dense_layers=1)),
}


def _preset(name: str) -> tuple[str, FamilySpec]:
    check(name in FAMILY_SIZES, "family", name, "one of " + ", ".join(FAMILY_SIZES))
    return FAMILY_SIZES[name]


def hf_config(family: str, spec: FamilySpec):
    """The transformers config object of `family` at these sizes (what config.json holds)."""
    import transformers

    family = _preset(family)[0]
    common = {"vocab_size": spec.vocab, "hidden_size": spec.hidden, "num_hidden_layers": spec.layers,
              "num_attention_heads": spec.heads, "intermediate_size": spec.ffn,
              "max_position_embeddings": spec.max_positions, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "dtype": "float32"}
    if family == "deepseek-v3":
        # SGLang needs moe_layer_freq/topk_method/scoring_func (real DeepSeek configs have them, transformers does
        # not write them) and, on CPU, YaRN rope ("Only deepseek_yarn is supported for CPU"): factor 1 is plain RoPE.
        rope = {"rope_type": "yarn", "rope_theta": ROPE_THETA, "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
                "original_max_position_embeddings": spec.max_positions, "mscale": 1, "mscale_all_dim": 1}
        return transformers.DeepseekV3Config(
            **common, architectures=["DeepseekV3ForCausalLM"], num_key_value_heads=spec.heads,
            n_routed_experts=spec.experts, num_experts_per_tok=spec.top_k, moe_intermediate_size=spec.moe_ffn,
            n_shared_experts=spec.shared_experts, n_group=1, topk_group=1, first_k_dense_replace=spec.dense_layers,
            q_lora_rank=spec.q_lora, kv_lora_rank=spec.kv_lora, qk_nope_head_dim=spec.head_dim,
            qk_rope_head_dim=spec.rope_head_dim, v_head_dim=spec.head_dim, rope_parameters=rope,
            num_nextn_predict_layers=0, moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid")
    qwen = {"num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim, "attention_bias": False,
            "use_sliding_window": False, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}}
    if family == "qwen3":
        return transformers.Qwen3Config(**common, **qwen, architectures=["Qwen3ForCausalLM"],
                                        max_window_layers=spec.layers)
    return transformers.Qwen3MoeConfig(
        **common, **qwen, architectures=["Qwen3MoeForCausalLM"], num_experts=spec.experts,
        num_experts_per_tok=spec.top_k, moe_intermediate_size=spec.moe_ffn, decoder_sparse_step=1,
        norm_topk_prob=True, mlp_only_layers=list(range(spec.dense_layers)))


def _mlp(prefix: str, h: int, ffn: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.gate_proj.weight": (ffn, h), f"{prefix}.up_proj.weight": (ffn, h),
            f"{prefix}.down_proj.weight": (h, ffn)}


def _attention(family: str, p: str, s: FamilySpec) -> dict[str, tuple[int, ...]]:
    h, n = s.hidden, s.heads
    if family == "deepseek-v3":  # MLA: q through a rank-q_lora bottleneck, k/v from a shared kv_lora latent
        return {f"{p}.q_a_proj.weight": (s.q_lora, h), f"{p}.q_a_layernorm.weight": (s.q_lora,),
                f"{p}.q_b_proj.weight": (n * (s.head_dim + s.rope_head_dim), s.q_lora),
                f"{p}.kv_a_proj_with_mqa.weight": (s.kv_lora + s.rope_head_dim, h),
                f"{p}.kv_a_layernorm.weight": (s.kv_lora,),
                f"{p}.kv_b_proj.weight": (n * 2 * s.head_dim, s.kv_lora),
                f"{p}.o_proj.weight": (h, n * s.head_dim)}
    q, kv = n * s.head_dim, s.kv_heads * s.head_dim
    return {f"{p}.q_proj.weight": (q, h), f"{p}.k_proj.weight": (kv, h), f"{p}.v_proj.weight": (kv, h),
            f"{p}.o_proj.weight": (h, q), f"{p}.q_norm.weight": (s.head_dim,), f"{p}.k_norm.weight": (s.head_dim,)}


def _moe(family: str, p: str, s: FamilySpec) -> dict[str, tuple[int, ...]]:
    out = {f"{p}.gate.weight": (s.experts, s.hidden)}
    if family == "deepseek-v3":
        out[f"{p}.gate.e_score_correction_bias"] = (s.experts,)
        out.update(_mlp(f"{p}.shared_experts", s.hidden, s.moe_ffn * s.shared_experts))
    for e in range(s.experts):
        out.update(_mlp(f"{p}.experts.{e}", s.hidden, s.moe_ffn))
    return out


def tensor_shapes(family: str, spec: FamilySpec | None = None) -> dict[str, tuple[int, ...]]:
    """HF checkpoint names and shapes of `family` (or a FAMILY_SIZES preset) at these sizes: per-expert names
    (`model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`), as transformers 5 saves them."""
    family, default = _preset(family)
    s = default if spec is None else spec
    shapes = {"model.embed_tokens.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (s.hidden,)
        shapes.update(_attention(family, f"{p}.self_attn", s))
        shapes[f"{p}.post_attention_layernorm.weight"] = (s.hidden,)
        if family == "qwen3" or i < s.dense_layers:
            shapes.update(_mlp(f"{p}.mlp", s.hidden, s.ffn))
        else:
            shapes.update(_moe(family, f"{p}.mlp", s))
    shapes["model.norm.weight"] = (s.hidden,)
    shapes["lm_head.weight"] = (s.vocab, s.hidden)
    return shapes


def init_weights(family: str, spec: FamilySpec | None = None) -> dict:
    """Deterministic random weights: normal(0, INIT_STD); norms 1 + 0.1 normal (perturbed so parity checks
    exercise them); DeepSeek's routing bias 0.02 normal (small beside the sigmoid scores it shifts)."""
    import torch

    s = _preset(family)[1] if spec is None else spec
    g = torch.Generator().manual_seed(s.seed)
    out = {}
    for name, shape in tensor_shapes(family, s).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("e_score_correction_bias"):
            t = 0.02 * torch.randn(shape, generator=g)
        else:
            t = INIT_STD * torch.randn(shape, generator=g)
        out[name] = t.contiguous()
    return out


def make_family(name: str, out_dir: str | Path, spec: FamilySpec | None = None) -> Path:
    """Write a complete HF model directory of family (or FAMILY_SIZES preset) `name` and return its path:
    config.json, model.safetensors, the char tokenizer's files and generation_config.json. `spec` None: the
    preset's (to change one size of it: `dataclasses.replace(FAMILY_SIZES[name][1], vocab=131)`)."""
    from safetensors.torch import save_file

    spec = _preset(name)[1] if spec is None else spec
    check(isinstance(spec, FamilySpec), "spec", spec, "a labkit.models.families.FamilySpec")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_config(name, spec).to_json_file(str(out / "config.json"), use_diff=False)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}))
    save_char_tokenizer(out)
    save_file(init_weights(name, spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def family_of(model_dir: str | Path) -> str:
    """The family of an HF model directory, from its config.json's model_type (one of MODEL_TYPES)."""
    f = Path(model_dir) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model_dir={str(model_dir)!r} has no config.json: expected an HF model directory")
    mt = json.loads(f.read_text()).get("model_type")
    check(mt in MODEL_TYPES, "model_type", mt, "one of " + ", ".join(MODEL_TYPES))
    return MODEL_TYPES[mt]


def family_model_dir(name: str, workdir: str | Path = "runs/models") -> str:
    """The directory of FAMILY_SIZES preset `name`, written under `workdir`/<name> from its spec's seed (once:
    a directory whose config.json is the preset's is reused as it is)."""
    family, spec = _preset(name)
    out = Path(workdir) / name
    want = hf_config(name, spec).to_json_string(use_diff=False)
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file() \
            and (out / "config.json").read_text() == want:
        return str(out)
    return str(make_family(name, out, spec))


def model_dir_for(model: str | Path | None, workdir: str | Path = "runs/models") -> str:
    """`--model`: None or "mimo" -> the shipped tiny MiMo; a FAMILY_SIZES preset name -> its directory (written
    under `workdir` on first use); anything else must be an HF model directory."""
    from labkit.models.tiny import default_model_dir

    if model is None or str(model) == "mimo":
        return default_model_dir()
    if str(model) in FAMILY_SIZES:
        return family_model_dir(str(model), workdir)
    if not Path(model).is_dir():
        raise ValueError(f"model={str(model)!r} is neither a model family ({', '.join(('mimo', *FAMILY_SIZES))}) "
                         "nor an HF model directory")
    return str(model)
