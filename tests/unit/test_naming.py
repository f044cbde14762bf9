"""labkit.models.naming: one naming of HF tensors per family, for the tiny models and the roofline alike. Its
names against the tiny checkpoints written from it are in test_families.py and test_roofline.py."""

import pytest

from labkit.models.naming import architecture, hf_tensors
from labkit.models.real import REAL

QWEN_MOE = {"model_type": "qwen3_moe", "vocab_size": 50, "hidden_size": 8, "intermediate_size": 12,
            "moe_intermediate_size": 4, "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 4, "num_experts": 3, "decoder_sparse_step": 2, "mlp_only_layers": [3]}


def _shapes(cfg: dict, **kw) -> dict:
    out = hf_tensors(cfg, **kw)
    assert len(out) == len(dict(out)), "a name twice"
    return dict(out)


def test_qwen3_moe_experts_skip_dense_layers_and_follow_the_sparse_step():
    t = _shapes(QWEN_MOE)
    moe = sorted({int(n.split(".")[2]) for n in t if ".experts." in n})
    assert moe == [1, 5]  # (i + 1) % 2 == 0, and layer 3 is in mlp_only_layers
    assert t["model.layers.1.mlp.experts.2.down_proj.weight"] == (8, 4)
    assert t["model.layers.1.mlp.gate.weight"] == (3, 8)
    assert t["model.layers.3.mlp.gate_proj.weight"] == (12, 8) and t["model.layers.0.self_attn.q_norm.weight"] == (4,)
    saved = {**{k: v for k, v in QWEN_MOE.items() if k != "num_experts"}, "num_local_experts": 3}  # transformers 5
    assert hf_tensors(saved) == hf_tensors(QWEN_MOE)


def test_mla_without_q_lora_has_one_q_proj_and_dense_first_layers():
    t = _shapes(REAL["moonlight-16b-a3b"])  # q_lora_rank: null
    a = "model.layers.0.self_attn"
    assert t[f"{a}.q_proj.weight"] == (16 * 192, 2048) and f"{a}.q_a_proj.weight" not in t
    assert t["model.layers.0.mlp.gate_proj.weight"] == (11264, 2048)  # first_k_dense_replace = 1
    assert t["model.layers.1.mlp.shared_experts.up_proj.weight"] == (2 * 1408, 2048)  # two shared experts
    assert t["model.layers.1.mlp.gate.e_score_correction_bias"] == (64,)
    assert not any(n.startswith("model.layers.0.mlp.experts.") for n in t)


def test_deepseek_mtp_layers_follow_the_trunk_with_their_own_embedding_and_head():
    cfg = REAL["deepseek-v3"]
    t = _shapes(cfg)
    mtp = "model.layers.61"
    assert t[f"{mtp}.eh_proj.weight"] == (7168, 2 * 7168) and t[f"{mtp}.shared_head.head.weight"] == (129280, 7168)
    assert t[f"{mtp}.self_attn.q_a_proj.weight"] == (1536, 7168) and f"{mtp}.mlp.experts.255.up_proj.weight" in t
    assert list(t)[-1] == f"{mtp}.shared_head.head.weight"
    bare = _shapes(cfg, mtp_layers=0)
    assert list(bare)[-1] == "lm_head.weight" and not any(n.startswith(f"{mtp}.") for n in bare)


def test_tied_embeddings_and_biases():
    cfg = {"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 4, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True}
    t = _shapes(cfg)
    assert "lm_head.weight" not in t and t["model.layers.0.self_attn.k_proj.bias"] == (4,)  # qwen2: biased q/k/v
    assert "model.layers.0.self_attn.k_proj.bias" not in _shapes({**cfg, "model_type": "llama"})
    assert _shapes({**cfg, "attention_bias": False}).keys() == _shapes({**cfg, "model_type": "llama"}).keys()


def test_families_and_unknown_types():
    assert architecture(REAL["kimi-k2"]) == "deepseek_v3"  # model_type kimi_k2 over DeepseekV3ForCausalLM
    assert architecture({"model_type": "mimo"}) == "mimo" and architecture({"model_type": "gpt2"}) is None
    with pytest.raises(ValueError, match=r"^model_type='gpt2' is invalid: expected one of deepseek_v3, qwen3_moe"):
        hf_tensors({"model_type": "gpt2"})
