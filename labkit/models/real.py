"""The config.json fields of real models the sync roofline needs (labkit.lab.roofline.tensors names their
tensors from these with labkit.models.naming). A module, not JSON files, so the configs ship with the package
(package data lists only py.typed). Only the fields that decide tensor names and shapes are kept.

Sources: the Hugging Face config.json files are not read here; each field is as Megatron-core argument scripts
restate it (vllm-project/vime `scripts/models/{moonlight,qwen3-30B-A3B,deepseek-v3,kimi-k2}.sh`: layers,
hidden, FFN and MoE FFN sizes, heads, KV groups, MLA ranks and head dims, vocabulary, experts, top-k, shared
experts, first dense layers, untied embeddings, expert bias) and, for DeepSeek-V3, as transformers'
`DeepseekV3Config` defaults (which are DeepSeek-V3's) give it. Moonlight's `q_lora_rank: null` follows from its
Megatron arguments passing no `--q-lora-rank`. Each model's `_source` names its config. Parameter totals from
these fields are unit-tested against the published sizes (tests/unit/test_roofline.py).
"""

from __future__ import annotations

_FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}

MOONLIGHT_16B_A3B = {
    "_name": "Moonlight-16B-A3B",
    "_source": "moonshotai/Moonlight-16B-A3B config.json (restated in vllm-project/vime scripts/models/moonlight.sh)",
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 11264, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "topk_method": "noaux_tc", "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

QWEN3_30B_A3B = {
    "_name": "Qwen3-30B-A3B",
    "_source": "Qwen/Qwen3-30B-A3B config.json (restated in vllm-project/vime scripts/models/qwen3-30B-A3B.sh)",
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

DEEPSEEK_V3 = {
    "_name": "DeepSeek-V3",
    "_source": "deepseek-ai/DeepSeek-V3 config.json (restated in vllm-project/vime scripts/models/deepseek-v3.sh "
               "and transformers' DeepseekV3Config defaults)",
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "topk_method": "noaux_tc", "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "quantization_config": _FP8_BLOCK,
}

KIMI_K2 = {
    "_name": "Kimi-K2",
    "_source": "moonshotai/Kimi-K2-Instruct config.json (restated in vllm-project/vime scripts/models/kimi-k2.sh)",
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "topk_method": "noaux_tc", "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "quantization_config": _FP8_BLOCK,
}

REAL: dict[str, dict] = {"moonlight-16b-a3b": MOONLIGHT_16B_A3B, "qwen3-30b-a3b": QWEN3_30B_A3B,
                         "deepseek-v3": DEEPSEEK_V3, "kimi-k2": KIMI_K2}
