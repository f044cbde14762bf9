import json
import math
from dataclasses import replace

import pytest

from labkit.models import tokenizer as char
from labkit.models.families import (
    FAMILIES,
    FAMILY_SIZES,
    FamilySpec,
    family_of,
    init_weights,
    make_family,
    tensor_shapes,
)
from labkit.config import ModelSpec
from labkit.models.hf import checkpoint_tensors
from labkit.models.naming import hf_tensors
from labkit.models.tiny import BENCH_SPEC, DEFAULT_DIR, make_tiny_mimo
from labkit.models.tiny import tensor_shapes as tiny_shapes
from labkit.tasks import ArithTask

PROMPTS = ["12+34=", "7+8=", "hello", "The cat", "0", "xyz!", "99+1="]
TINY = {"qwen3-moe": "qwen3-moe-tiny"}  # family -> its preset at the tiny default sizes


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {f: make_family(TINY.get(f, f), tmp_path_factory.mktemp(f)) for f in FAMILIES}


@pytest.fixture(scope="module")
def loaded(family_dirs):
    """family -> (model, loading info, tokenizer), each loaded once through the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for f, d in family_dirs.items():
        model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
        out[f] = (model.eval(), info, AutoTokenizer.from_pretrained(d))
    return out


@pytest.mark.parametrize("family,model_type,arch", [
    ("qwen3", "qwen3", "Qwen3ForCausalLM"), ("qwen3-moe", "qwen3_moe", "Qwen3MoeForCausalLM"),
    ("deepseek-v3", "deepseek_v3", "DeepseekV3ForCausalLM"),
])
def test_directory_loads_with_transformers_and_char_tokenizer(family_dirs, loaded, family, model_type, arch):
    from transformers import AutoConfig

    d = family_dirs[family]
    assert AutoConfig.from_pretrained(d).model_type == model_type
    model, info, tok = loaded[family]
    assert type(model).__name__ == arch
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert family_of(d) == family
    task = ArithTask()
    for p in task.problems(4, seed=0):
        assert tok.encode(p.prompt, add_special_tokens=False) == char.encode(p.prompt)
    assert (tok.eos_token_id, tok.pad_token_id) == (char.EOS, char.PAD)
    shipped = json.loads((DEFAULT_DIR / "tokenizer.json").read_text())  # the tiny MiMo's: one tokenizer for all
    assert json.loads((d / "tokenizer.json").read_text())["model"] == shipped["model"]
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == char.EOS and gen["do_sample"] is False


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_names_and_shapes_match_the_family(family_dirs, family):
    header = checkpoint_tensors(family_dirs[family])
    assert {n: s for n, (s, _) in header.items()} == tensor_shapes(TINY.get(family, family))
    assert {dt for _, dt in header.values()} == {"float32"}
    assert len(header) == {"qwen3": 25, "qwen3-moe": 69, "deepseek-v3": 53}[family]
    assert not any(n.endswith(".bias") for n in header)
    if family == "qwen3":
        assert header["model.layers.1.self_attn.q_norm.weight"][0] == (16,)
        assert header["model.layers.1.mlp.gate_proj.weight"][0] == (128, 64)
    elif family == "qwen3-moe":
        for layer in range(2):
            for e in range(8):
                p = f"model.layers.{layer}.mlp.experts.{e}"
                assert header[f"{p}.gate_proj.weight"][0] == header[f"{p}.up_proj.weight"][0] == (32, 64)
                assert header[f"{p}.down_proj.weight"][0] == (64, 32)
            assert header[f"model.layers.{layer}.mlp.gate.weight"][0] == (8, 64)
    else:
        a = "model.layers.1.self_attn"
        assert header[f"{a}.q_a_proj.weight"][0] == (32, 64)
        assert header[f"{a}.q_b_proj.weight"][0] == (4 * (16 + 8), 32)
        assert header[f"{a}.kv_a_proj_with_mqa.weight"][0] == (32 + 8, 64)
        assert header[f"{a}.kv_b_proj.weight"][0] == (4 * (16 + 16), 32)
        assert header[f"{a}.o_proj.weight"][0] == (64, 4 * 16)
        assert header["model.layers.0.mlp.gate_proj.weight"][0] == (128, 64)  # first_k_dense_replace=1
        assert not any(n.startswith("model.layers.0.mlp.experts") for n in header)
        assert header["model.layers.1.mlp.gate.e_score_correction_bias"][0] == (8,)
        assert header["model.layers.1.mlp.shared_experts.gate_proj.weight"][0] == (32, 64)
        assert header["model.layers.1.mlp.experts.7.down_proj.weight"][0] == (64, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_naming_of_the_saved_config_is_the_checkpoint(family_dirs, family):
    """labkit.models.naming applied to config.json as transformers wrote it (qwen3_moe's num_experts saved as
    num_local_experts) names every tensor of the checkpoint, with its shape."""
    d = family_dirs[family]
    named = hf_tensors(json.loads((d / "config.json").read_text()))
    assert dict(named) == {n: s for n, (s, _) in checkpoint_tensors(d).items()} and len(named) == len(dict(named))


@pytest.mark.parametrize("spec", [None, ModelSpec(hidden=32, layers=3, heads=4, kv_heads=1, ffn=40, mtp_layers=2)])
def test_naming_of_a_mimo_config_is_the_checkpoint(tmp_path, spec):
    """The shipped tiny MiMo (one MTP layer) and one written with two MTP layers and another GQA ratio."""
    d = DEFAULT_DIR if spec is None else make_tiny_mimo(tmp_path / "mimo", spec)
    named = hf_tensors(json.loads((d / "config.json").read_text()))
    assert dict(named) == {n: s for n, (s, _) in checkpoint_tensors(d).items()} and len(named) == len(dict(named))


def test_deepseek_config_has_what_sglang_needs(family_dirs):
    cfg = json.loads((family_dirs["deepseek-v3"] / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0 and cfg["moe_layer_freq"] == 1 and cfg["first_k_dense_replace"] == 1
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["n_group"], cfg["topk_group"]) == ("noaux_tc", "sigmoid", 1, 1)
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "yarn" and rope["factor"] == 1.0 and rope["original_max_position_embeddings"] == 256
    moe = json.loads((family_dirs["qwen3-moe"] / "config.json").read_text())
    assert (moe["num_local_experts"], moe["num_experts_per_tok"], moe["mlp_only_layers"]) == (8, 2, [])


def test_loaded_model_holds_the_checkpoint_tensors(family_dirs, loaded):
    """transformers fuses per-expert tensors at load: the fused ones must hold exactly the file's."""
    import torch
    from safetensors.torch import load_file

    sd = load_file(str(family_dirs["qwen3-moe"] / "model.safetensors"))
    experts = loaded["qwen3-moe"][0].model.layers[1].mlp.experts
    p = "model.layers.1.mlp.experts.5"
    assert torch.equal(experts.gate_up_proj[5], torch.cat([sd[f"{p}.gate_proj.weight"], sd[f"{p}.up_proj.weight"]]))
    assert torch.equal(experts.down_proj[5], sd[f"{p}.down_proj.weight"])
    sd = load_file(str(family_dirs["deepseek-v3"] / "model.safetensors"))
    gate = loaded["deepseek-v3"][0].model.layers[1].mlp.gate
    assert torch.equal(gate.e_score_correction_bias, sd["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert torch.equal(gate.weight, sd["model.layers.1.mlp.gate.weight"])


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_is_finite_and_greedy_depends_on_the_prompt(loaded, family):
    import torch

    model, _, tok = loaded[family]
    nxt = set()
    with torch.no_grad():
        for p in PROMPTS:
            logits = model(torch.tensor([tok.encode(p, add_special_tokens=False)])).logits
            assert logits.shape[-1] == 128 and torch.isfinite(logits).all()
            nxt.add(int(logits[0, -1].argmax()))
        ids, _ = ArithTask().batch(ArithTask().problems(3, seed=1))
        assert torch.isfinite(model(ids).logits).all()
    assert len(nxt) >= 3, nxt


def test_same_seed_writes_the_same_bytes(tmp_path):
    a = make_family("qwen3-moe", tmp_path / "a", FamilySpec(seed=3))
    b = make_family("qwen3-moe", tmp_path / "b", FamilySpec(seed=3))
    c = make_family("qwen3-moe", tmp_path / "c", FamilySpec(seed=4))
    weights = [(d / "model.safetensors").read_bytes() for d in (a, b, c)]
    assert weights[0] == weights[1] and weights[0] != weights[2]
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()


def _nbytes(shapes: dict) -> int:
    return 4 * sum(math.prod(s) for s in shapes.values())  # fp32


def test_many_tensor_preset_holds_the_dense_bench_models_bytes():
    """`labkit bench sync --model qwen3-moe` compares its GB/s with the dense bench model's: the two must differ
    in tensor count, not in bytes (at 9 MB fixed per-sync costs set the MoE model's GB/s)."""
    moe, dense = tensor_shapes("qwen3-moe"), tiny_shapes(BENCH_SPEC)
    assert len(moe) == 4179 and len(moe) >= 13 * len(dense)
    assert abs(_nbytes(moe) / _nbytes(dense) - 1) < 0.1, (_nbytes(moe), _nbytes(dense))
    assert FAMILY_SIZES["qwen3-moe"][1].moe_ffn % 32 == 0  # unpadded on a CPU engine, as real checkpoints are


def test_many_tensor_preset(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    # The preset's counts at a small width (the preset itself is 300 MB: the bench writes it, not a unit test).
    d = make_family("qwen3-moe", tmp_path / "many", replace(FAMILY_SIZES["qwen3-moe"][1], hidden=32, moe_ffn=16))
    header = checkpoint_tensors(d)
    # 16 layers x (84 experts x 3 + router + 4 attention + 2 q/k norms + 2 norms) + embedding, final norm, lm_head
    assert len(header) == 4179
    assert sum(n.count(".experts.") for n in header) == 16 * 84 * 3
    assert (d / "model.safetensors").stat().st_size < 16 * 2**20
    assert family_of(d) == "qwen3-moe"
    assert sorted(tensor_shapes("qwen3-moe")) == sorted(header)
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)  # ~1 s: per-expert -> fused
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with torch.no_grad():
        assert torch.isfinite(model.eval()(torch.tensor([char.encode("12+34=")])).logits).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_vocab_not_a_multiple_of_64(tmp_path, family):
    import torch
    from transformers import AutoModelForCausalLM

    spec = FamilySpec(vocab=131, **({"dense_layers": 1} if family == "deepseek-v3" else {}))
    d = make_family(family, tmp_path / family, spec)
    assert checkpoint_tensors(d)["model.embed_tokens.weight"][0] == (131, 64)
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        logits = model(torch.tensor([char.encode("3+4=")])).logits
    assert logits.shape == (1, 4, 131) and torch.isfinite(logits).all()


@pytest.mark.parametrize("kwargs,field", [
    ({"vocab": 99}, "vocab"), ({"hidden": 0}, "hidden"), ({"layers": "2"}, "layers"), ({"kv_heads": 3}, "kv_heads"),
    ({"top_k": 9}, "top_k"), ({"dense_layers": 2}, "dense_layers"), ({"head_dim": 7}, "head_dim"),
    ({"rope_head_dim": 3}, "rope_head_dim"), ({"experts": True}, "experts"), ({"seed": -1}, "seed"),
    ({"shared_experts": 0}, "shared_experts"),
])
def test_bad_spec_values_are_named(kwargs, field):
    (value,) = kwargs.values()
    with pytest.raises(ValueError, match=rf"^{field}={value!r} is invalid: expected "):
        FamilySpec(**kwargs)


def test_unknown_family_and_model_type_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"^family='llama' is invalid: expected one of qwen3, qwen3-moe, "
                                         r"qwen3-moe-tiny, deepseek-v3"):
        make_family("llama", tmp_path)
    with pytest.raises(ValueError, match=r"^spec=.*is invalid"):
        make_family("qwen3", tmp_path, spec={"hidden": 64})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"^model_type='gpt2' is invalid: expected one of mimo, qwen3, qwen3_moe"):
        family_of(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        family_of(tmp_path / "nowhere")


def test_presets_and_mimo():
    assert set(FAMILIES) <= set(FAMILY_SIZES) and FAMILY_SIZES["deepseek-v3"][1].dense_layers == 1
    assert family_of(DEFAULT_DIR) == "mimo"
    w = init_weights("deepseek-v3")
    assert all(float(t.mean()) > 0.5 for n, t in w.items() if n.endswith("norm.weight"))
    assert all(float(t.abs().max()) < 0.2 for n, t in w.items() if n.endswith("e_score_correction_bias"))


def test_model_argument_resolves_names_and_directories(tmp_path, monkeypatch):
    from labkit.models.families import model_dir_for

    assert model_dir_for(None) == model_dir_for("mimo") == str(DEFAULT_DIR)
    d = model_dir_for("qwen3-moe-tiny", tmp_path)
    assert d == str(tmp_path / "qwen3-moe-tiny") and family_of(d) == "qwen3-moe"
    mtime = (tmp_path / "qwen3-moe-tiny" / "model.safetensors").stat().st_mtime_ns
    assert model_dir_for("qwen3-moe-tiny", tmp_path) == d  # reused, not rewritten
    assert (tmp_path / "qwen3-moe-tiny" / "model.safetensors").stat().st_mtime_ns == mtime
    assert model_dir_for(d) == d
    with pytest.raises(ValueError, match=r"^model='qwen4' is neither a model family \(mimo, qwen3, .*\) nor an HF"):
        model_dir_for("qwen4")
