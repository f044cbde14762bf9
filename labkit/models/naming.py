"""HF checkpoint names and shapes of every tensor of a model, from its config.json alone (no torch, no weights).

One tensor per expert projection (`model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`): what HF
checkpoints hold and SGLang's loaders receive (transformers 5 fuses experts in memory; checkpoints and syncs do
not). labkit's tiny models are written from this naming (labkit.models.tiny, labkit.models.families) and the
sync roofline enumerates real models with it (labkit.lab.roofline.tensors), so the two cannot drift apart.

Families (config.json's model_type; a DeepseekV3ForCausalLM in `architectures` is deepseek_v3 whatever its type):
- llama, qwen2, qwen3, mimo: GQA attention (q/k/v biases where `attention_bias`, on by default for qwen2 and
  mimo; q/k norms for qwen3) and a gated MLP; labkit's mimo (a Qwen2 trunk) adds its MTP layers as
  model.mtp_layers.{i};
- qwen3_moe: qwen3 with routed experts on every decoder_sparse_step-th layer outside mlp_only_layers;
- deepseek_v3 (DeepSeek-V3, Moonlight, Kimi-K2 as kimi_k2): MLA (q through a q_lora_rank bottleneck, or one
  q_proj where q_lora_rank is null), dense MLPs on the first first_k_dense_replace layers, then MoE layers:
  the router (with its e_score_correction_bias for topk_method noaux_tc), the shared experts, the routed
  experts; MTP layer k is model.layers.{L+k} with its own embedding and head copy.
`lm_head.weight` is left out where tie_word_embeddings is set.

The order is part of the naming: labkit's tiny models draw their random weights in it (the same seed writes the
same bytes only while it holds), and the roofline's planner packs buckets in it.
"""

from __future__ import annotations

from labkit.models.hf import num_experts

ARCHITECTURES = ("deepseek_v3", "qwen3_moe", "qwen3", "qwen2", "llama", "mimo")
ALIASES = {"kimi_k2": "deepseek_v3"}  # Kimi-K2's config.json says kimi_k2 over DeepseekV3ForCausalLM
Shapes = list[tuple[str, tuple[int, ...]]]


def architecture(cfg: dict) -> str | None:
    """The family (one of ARCHITECTURES) a config's tensors are named by; None for a family labkit cannot name."""
    if "DeepseekV3ForCausalLM" in (cfg.get("architectures") or ()):
        return "deepseek_v3"
    mt = ALIASES.get(cfg.get("model_type"), cfg.get("model_type"))
    return mt if mt in ARCHITECTURES else None


def hf_tensors(cfg: dict, mtp_layers: int | None = None) -> Shapes:
    """(HF name, shape) of every tensor of the model `cfg` (a config.json dict), in checkpoint order: embedding,
    layers, final norm, head, MTP layers. `mtp_layers`: how many MTP layers to name (None: the config's
    num_nextn_predict_layers; 0 leaves them out)."""
    arch = architecture(cfg)
    if arch is None:
        raise ValueError(f"model_type={cfg.get('model_type')!r} is invalid: expected one of "
                         f"{', '.join(ARCHITECTURES)} (or kimi_k2)")
    n_mtp = int(cfg.get("num_nextn_predict_layers") or 0) if mtp_layers is None else int(mtp_layers)
    return _deepseek(cfg, n_mtp) if arch == "deepseek_v3" else _gqa_family(cfg, arch, n_mtp)


def _head_dim(c: dict) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def _mlp(p: str, h: int, ffn: int) -> Shapes:
    return [(f"{p}.gate_proj.weight", (ffn, h)), (f"{p}.up_proj.weight", (ffn, h)), (f"{p}.down_proj.weight", (h, ffn))]


def _experts(p: str, h: int, ffn: int, n: int) -> Shapes:
    return [x for j in range(n) for x in _mlp(f"{p}.experts.{j}", h, ffn)]


def _gqa(a: str, c: dict, bias: bool, qk_norm: bool) -> Shapes:
    h, hd = c["hidden_size"], _head_dim(c)
    q, kv = c["num_attention_heads"] * hd, c.get("num_key_value_heads") or c["num_attention_heads"]
    out: Shapes = []
    for proj, rows in (("q_proj", q), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        out.append((f"{a}.{proj}.weight", (rows, h)))
        if bias:
            out.append((f"{a}.{proj}.bias", (rows,)))
    out.append((f"{a}.o_proj.weight", (h, q)))
    if qk_norm:
        out += [(f"{a}.q_norm.weight", (hd,)), (f"{a}.k_norm.weight", (hd,))]
    return out


def _qwen_sparse(c: dict, i: int) -> bool:
    step = int(c.get("decoder_sparse_step") or 1)
    return num_experts(c) > 0 and i not in (c.get("mlp_only_layers") or ()) and (i + 1) % step == 0


def _gqa_family(c: dict, arch: str, n_mtp: int) -> Shapes:
    """llama / qwen2 / qwen3 / qwen3_moe / mimo."""
    h = c["hidden_size"]
    bias = c.get("attention_bias", arch in ("qwen2", "mimo"))
    qk_norm = arch in ("qwen3", "qwen3_moe")

    def layer(p: str, i: int) -> Shapes:
        out = [(f"{p}.input_layernorm.weight", (h,)), *_gqa(f"{p}.self_attn", c, bias, qk_norm),
               (f"{p}.post_attention_layernorm.weight", (h,))]
        if arch == "qwen3_moe" and _qwen_sparse(c, i):
            n = num_experts(c)
            return out + [(f"{p}.mlp.gate.weight", (n, h)), *_experts(f"{p}.mlp", h, c["moe_intermediate_size"], n)]
        return out + _mlp(f"{p}.mlp", h, c["intermediate_size"])

    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        out += layer(f"model.layers.{i}", i)
    out += _final(c)
    if arch == "mimo":
        for i in range(n_mtp):
            p = f"model.mtp_layers.{i}"
            out += [(f"{p}.token_layernorm.weight", (h,)), (f"{p}.hidden_layernorm.weight", (h,)),
                    (f"{p}.input_proj.weight", (h, 2 * h)), (f"{p}.final_layernorm.weight", (h,)), *layer(p, 0)]
    return out


def _final(c: dict) -> Shapes:
    """The final norm and, unless tied to the embedding, the head."""
    h = c["hidden_size"]
    head = [] if c.get("tie_word_embeddings", False) else [("lm_head.weight", (c["vocab_size"], h))]
    return [("model.norm.weight", (h,)), *head]


def _mla(a: str, c: dict) -> Shapes:
    h, heads, rope, nope = c["hidden_size"], c["num_attention_heads"], c["qk_rope_head_dim"], c["qk_nope_head_dim"]
    kvl, v = c["kv_lora_rank"], c["v_head_dim"]
    if c.get("q_lora_rank"):
        ql = c["q_lora_rank"]
        out = [(f"{a}.q_a_proj.weight", (ql, h)), (f"{a}.q_a_layernorm.weight", (ql,)),
               (f"{a}.q_b_proj.weight", (heads * (nope + rope), ql))]
    else:
        out = [(f"{a}.q_proj.weight", (heads * (nope + rope), h))]
    return out + [(f"{a}.kv_a_proj_with_mqa.weight", (kvl + rope, h)), (f"{a}.kv_a_layernorm.weight", (kvl,)),
                  (f"{a}.kv_b_proj.weight", (heads * (nope + v), kvl)), (f"{a}.o_proj.weight", (h, heads * v))]


def _deepseek_layer(p: str, c: dict, i: int) -> Shapes:
    h, n = c["hidden_size"], num_experts(c)
    out = [(f"{p}.input_layernorm.weight", (h,)), *_mla(f"{p}.self_attn", c),
           (f"{p}.post_attention_layernorm.weight", (h,))]
    if not (n and i >= (c.get("first_k_dense_replace") or 0) and i % int(c.get("moe_layer_freq") or 1) == 0):
        return out + _mlp(f"{p}.mlp", h, c["intermediate_size"])
    out.append((f"{p}.mlp.gate.weight", (n, h)))
    if c.get("topk_method") == "noaux_tc":
        out.append((f"{p}.mlp.gate.e_score_correction_bias", (n,)))
    if c.get("n_shared_experts"):
        out += _mlp(f"{p}.mlp.shared_experts", h, c["moe_intermediate_size"] * c["n_shared_experts"])
    return out + _experts(f"{p}.mlp", h, c["moe_intermediate_size"], n)


def _deepseek(c: dict, n_mtp: int) -> Shapes:
    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    out = [("model.embed_tokens.weight", (v, h))]
    for i in range(layers):
        out += _deepseek_layer(f"model.layers.{i}", c, i)
    out += _final(c)
    for k in range(n_mtp):
        p = f"model.layers.{layers + k}"
        out += [(f"{p}.embed_tokens.weight", (v, h)), (f"{p}.enorm.weight", (h,)), (f"{p}.hnorm.weight", (h,)),
                (f"{p}.eh_proj.weight", (h, 2 * h)), *_deepseek_layer(p, c, layers + k),
                (f"{p}.shared_head.norm.weight", (h,)), (f"{p}.shared_head.head.weight", (v, h))]
    return out
