"""Tiny random checkpoints of real model families: Qwen3 (dense), Qwen3-MoE and DeepSeek-V3 (MLA + MoE).

A weight sync meets each family's own layout: q/k norms (Qwen3), hundreds of per-expert tensors that an
engine fuses into `w13`/`w2` (MoE), MLA's low-rank projections that an engine fuses across two HF tensors
(DeepSeek-V3). So each directory here holds exactly what a real checkpoint of that family holds: config.json
written by the transformers config class, HF checkpoint names (labkit.models.naming applied to that config, per
expert), labkit's char tokenizer (so `labkit.tasks.ArithTask` runs on every family) and random weights fixed by
the spec's seed. The tensors are written directly from their names and shapes: no HF model is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.config import _int, check
from labkit.models.naming import hf_tensors
from labkit.models.tokenizer import BOS, EOS, PAD, VOCAB, save_char_tokenizer

FAMILIES = ("qwen3", "qwen3-moe", "deepseek-v3")
# config.json's model_type -> family name (mimo: labkit.models.tiny).
MODEL_TYPES = {"mimo": "mimo", "qwen3": "qwen3", "qwen3_moe": "qwen3-moe", "deepseek_v3": "deepseek-v3"}
ROPE_THETA = 10000.0
# Large enough that greedy output depends on the prompt (test_forward_is_finite_and_greedy_depends_on_the_prompt);
# at the usual 0.02 a model this small answers every prompt with the same token.
INIT_STD = 0.2


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
    """DeepSeek-V3: rank of q's low-rank projection (q_lora_rank); 0 writes `q_lora_rank: null`, a plain q_proj
    (Moonlight)."""
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
                  "shared_experts", "kv_lora", "rope_head_dim", "max_positions"):
            _int(f, getattr(self, f))
        _int("vocab", self.vocab, lo=len(VOCAB))
        _int("dense_layers", self.dense_layers, lo=0)
        _int("q_lora", self.q_lora, lo=0)
        _int("seed", self.seed, lo=0)
        check(self.heads % self.kv_heads == 0, "kv_heads", self.kv_heads, f"a divisor of heads={self.heads}")
        check(self.top_k <= self.experts, "top_k", self.top_k, f"at most experts={self.experts}")
        check(self.dense_layers < self.layers, "dense_layers", self.dense_layers, f"less than layers={self.layers}")
        check(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even integer (RoPE rotates pairs)")
        check(self.rope_head_dim % 2 == 0, "rope_head_dim", self.rope_head_dim, "an even integer (RoPE rotates pairs)")


# name -> (family, spec). `qwen3-moe` is a checkpoint of 4,179 tensors (16 layers x 84 experts x 3; Qwen3-30B-A3B
# has 18,867, labkit.models.real) holding about the bytes of the dense bench model (labkit.models.tiny.BENCH_SPEC,
# 307 tensors): data/bench_sync_moe_cpu.json and data/bench_sync_cpu.json record 299,706,112 and 317,407,232
# bytes. The two differ in tensor count, not in bytes, so `labkit bench sync --model qwen3-moe` measures what the
# count costs a sync rather than what its bytes do (a unit test keeps them within 10 %). Its expert width 96 is a
# multiple of 32, as real checkpoints' are, so a CPU engine does not pad it. The others are at the tiny default
# sizes (`qwen3-moe-tiny`: 69 tensors, for tests; the integration tests pad an expert width of 16).
FAMILY_SIZES: dict[str, tuple[str, FamilySpec]] = {
    "qwen3": ("qwen3", FamilySpec()),
    "qwen3-moe": ("qwen3-moe", FamilySpec(hidden=192, layers=16, heads=4, kv_heads=2, head_dim=8, ffn=64,
                                          experts=84, moe_ffn=96)),
    "qwen3-moe-tiny": ("qwen3-moe", FamilySpec()),
    "deepseek-v3": ("deepseek-v3", FamilySpec(dense_layers=1)),
    # Moonlight-16B-A3B's architecture (verl PR #2418's model): DeepSeek-V3 MLA without a q LoRA (a plain q_proj),
    # two shared experts, a first dense layer. `moonlight` is tiny (an expert width 24 a CPU engine pads to 32);
    # `moonlight-bench` has Moonlight's own tensor count, 27 layers of 64 experts (5,317 tensors; Moonlight has
    # the same names, labkit.models.real), at widths a CPU box syncs.
    "moonlight": ("deepseek-v3", FamilySpec(hidden=80, heads=5, kv_heads=5, experts=6, moe_ffn=24, shared_experts=2,
                                            q_lora=0, dense_layers=1)),
    "moonlight-bench": ("deepseek-v3", FamilySpec(hidden=64, layers=27, heads=4, kv_heads=4, head_dim=16, ffn=128,
                                                  experts=64, top_k=6, moe_ffn=32, shared_experts=2, q_lora=0,
                                                  dense_layers=1)),
    # Block-FP8 checkpoints (labkit.models.fp8): every quantized row block and K a multiple of 128, as SGLang's
    # Fp8 methods require (q/k/v and gate/up parts, the expert width) and its weight checker assumes.
    "qwen3-fp8": ("qwen3", FamilySpec(hidden=128, heads=2, kv_heads=1, head_dim=128, ffn=256)),
    "qwen3-moe-fp8": ("qwen3-moe", FamilySpec(hidden=128, heads=2, kv_heads=1, head_dim=128, ffn=128, experts=4,
                                              moe_ffn=128)),
    # MLA: q_lora_rank a multiple of 128, so the fused a-pair's scale rows split where its weight rows do; kv_a
    # (kv_lora + rope = 192 rows) ends in a partial block, as DeepSeek-V3's own (576 rows) does.
    "deepseek-v3-fp8": ("deepseek-v3", FamilySpec(hidden=128, heads=2, head_dim=128, ffn=128, experts=4,
                                                  moe_ffn=128, dense_layers=1, q_lora=128, kv_lora=128,
                                                  rope_head_dim=64)),
}
# Presets written as a block-FP8 checkpoint (the engine's model dir) with their unquantized original in MASTER
# beside it, the weights a trainer holds: a bf16 trainer syncing into an FP8 engine.
FP8_PRESETS = ("qwen3-fp8", "qwen3-moe-fp8", "deepseek-v3-fp8")


def _preset(name: str) -> tuple[str, FamilySpec]:
    check(name in FAMILY_SIZES, "family", name, "one of " + ", ".join(FAMILY_SIZES))
    return FAMILY_SIZES[name]


def config_fields(family: str, spec: FamilySpec) -> dict:
    """config.json's fields of `family` (or a FAMILY_SIZES preset) at these sizes, with its model_type: what
    `hf_config` gives the transformers config class, and what `tensor_shapes` names the tensors from."""
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
        return dict(
            **common, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
            num_key_value_heads=spec.heads, n_routed_experts=spec.experts, num_experts_per_tok=spec.top_k,
            moe_intermediate_size=spec.moe_ffn, n_shared_experts=spec.shared_experts, n_group=1, topk_group=1,
            first_k_dense_replace=spec.dense_layers, q_lora_rank=spec.q_lora or None, kv_lora_rank=spec.kv_lora,
            qk_nope_head_dim=spec.head_dim, qk_rope_head_dim=spec.rope_head_dim, v_head_dim=spec.head_dim,
            rope_parameters=rope, num_nextn_predict_layers=0, moe_layer_freq=1, topk_method="noaux_tc",
            scoring_func="sigmoid")
    qwen = {"num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim, "attention_bias": False,
            "use_sliding_window": False, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}}
    if family == "qwen3":
        return {**common, **qwen, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                "max_window_layers": spec.layers}
    return {**common, **qwen, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "num_experts": spec.experts, "num_experts_per_tok": spec.top_k, "moe_intermediate_size": spec.moe_ffn,
            "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": list(range(spec.dense_layers))}


def hf_config(family: str, spec: FamilySpec):
    """The transformers config object of `family` at these sizes (what config.json holds)."""
    import transformers

    fields = config_fields(family, spec)
    cls = {"qwen3": transformers.Qwen3Config, "qwen3_moe": transformers.Qwen3MoeConfig,
           "deepseek_v3": transformers.DeepseekV3Config}[fields.pop("model_type")]
    return cls(**fields)


def tensor_shapes(family: str, spec: FamilySpec | None = None) -> dict[str, tuple[int, ...]]:
    """HF checkpoint names and shapes of `family` (or a FAMILY_SIZES preset) at these sizes: labkit.models.naming
    applied to its config.json fields (per-expert names, `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`,
    as transformers 5 saves them)."""
    s = _preset(family)[1] if spec is None else spec
    return dict(hf_tensors(config_fields(family, s)))


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
    out = Path(workdir) / name
    return _fp8_preset_dir(name, out) if name in FP8_PRESETS else _written(name, out)


def _written(name: str, out: Path) -> str:
    """Preset `name` in `out`, written unless the directory already holds it (same config.json)."""
    spec = _preset(name)[1]
    want = hf_config(name, spec).to_json_string(use_diff=False)
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file() \
            and (out / "config.json").read_text() == want:
        return str(out)
    return str(make_family(name, out, spec))


def _fp8_preset_dir(name: str, out: Path) -> str:
    """An FP8 preset: its unquantized original under out/MASTER (reused as family presets are), and the block-FP8
    checkpoint of it in `out`, written again whenever the original was."""
    from labkit.models import fp8

    weights = out / fp8.MASTER / "model.safetensors"
    before = weights.stat().st_mtime_ns if weights.is_file() else None
    _written(name, out / fp8.MASTER)
    if before != weights.stat().st_mtime_ns or not (out / "model.safetensors").is_file():
        fp8.write_checkpoint(out / fp8.MASTER, out)
    return str(out)


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
