import json
import re

import pytest

from labkit.config import ModelSpec, ParallelSpec, TrainConfig
from labkit.models import tokenizer
from labkit.models.hf import check_parallel, read_config_json
from labkit.models.tiny import DEFAULT_DIR, hf_config, make_tiny_mimo, tensor_shapes
from labkit.tasks import arith


@pytest.mark.parametrize("kwargs,field", [
    ({"hidden": 0}, "hidden"), ({"hidden": 130, "heads": 4}, "hidden"), ({"kv_heads": 3}, "kv_heads"),
    ({"layers": "2"}, "layers"), ({"mtp_layers": -1}, "mtp_layers"),
])
def test_model_spec_rejects_bad_values_naming_them(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        ModelSpec(**kwargs)


def test_parallel_and_train_config_validate():
    with pytest.raises(ValueError, match="tp=0"):
        ParallelSpec(tp=0)
    with pytest.raises(ValueError, match="lr=-1"):
        TrainConfig(lr=-1)
    with pytest.raises(ValueError, match="mtp_target='kl'"):
        TrainConfig(mtp_target="kl")
    with pytest.raises(ValueError, match="mtp_target='policy'.*mtp_detach=True"):
        TrainConfig(mtp_target="policy")  # the KL must not pull the trunk towards the draft
    assert ParallelSpec(tp=2, pp=2).world_size == 4
    assert ParallelSpec(tp=2, ep=2).world_size == 4  # EP ranks are data-parallel replicas of the dense part


def test_tp_that_does_not_divide_heads_is_named():
    cfg = hf_config(ModelSpec(heads=4, kv_heads=2))
    with pytest.raises(ValueError, match=r"tp=3 .*num_attention_heads=4"):
        check_parallel(cfg, 3, 1)
    with pytest.raises(ValueError, match=r"tp=4 .*num_key_value_heads=2"):
        check_parallel(cfg, 4, 1)
    with pytest.raises(ValueError, match=r"pp=3 .*num_hidden_layers=2"):
        check_parallel(cfg, 1, 3)
    check_parallel(cfg, 2, 2)
    check_parallel({**cfg, "vocab_size": 131}, 2, 1)  # an odd vocabulary is padded in the trainer (trainer.vocab)
    with pytest.raises(ValueError, match=r"^ep=2 is invalid: 'mimo' has no experts"):
        check_parallel(cfg, 1, 1, 2)
    moe = {"model_type": "qwen3_moe", "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8}
    check_parallel(moe, 1, 1, 2)
    with pytest.raises(ValueError, match=r"^ep=3 is invalid: it must divide the routed experts \(8\)"):
        check_parallel(moe, 1, 1, 3)
    with pytest.raises(ValueError, match=r"^ep=0 is invalid"):
        ParallelSpec(ep=0)
    from types import SimpleNamespace

    from labkit.models.hf import num_experts

    assert num_experts(moe) == num_experts(SimpleNamespace(n_routed_experts=8)) == 8 and num_experts(cfg) == 0


def test_vocab_padding_follows_megatron_lm_only_where_tp_does_not_divide():
    from labkit.trainer.vocab import padded_size

    assert padded_size(131, 1) == 131 and padded_size(128, 2) == 128 and padded_size(130, 2) == 130
    assert padded_size(131, 2) == 256 and padded_size(131, 4) == 512 and padded_size(257, 2) == 512
    for vocab in range(100, 400, 7):
        for tp in (1, 2, 3, 4, 8):
            size = padded_size(vocab, tp)
            assert size >= vocab and size % tp == 0 and (size == vocab or size % 128 == 0)


def test_missing_config_json_and_unknown_model_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_config_json(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        read_config_json(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match="model_type='gpt_neox'"):
        read_config_json(tmp_path)


def test_tiny_model_dir_is_deterministic_and_complete(tmp_path):
    from safetensors.torch import load_file

    spec = ModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, ffn=64, seed=7)
    a, b = make_tiny_mimo(tmp_path / "a", spec), make_tiny_mimo(tmp_path / "b", spec)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in wa.items()} == tensor_shapes(spec)
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any(k.startswith("model.mtp_layers.0.") for k in wa)
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["model_type"] == "mimo" and cfg["num_nextn_predict_layers"] == 1
    other = load_file(str(make_tiny_mimo(tmp_path / "c", ModelSpec(hidden=32, layers=2, heads=2, kv_heads=1,
                                                                   ffn=64, seed=8)) / "model.safetensors"))
    assert not (other["lm_head.weight"] == wa["lm_head.weight"]).all()


def test_char_tokenizer_loads_in_transformers_and_matches_pure_encoding(tmp_path):
    from transformers import AutoTokenizer

    d = make_tiny_mimo(tmp_path / "m", ModelSpec(hidden=32, heads=2, kv_heads=1, ffn=64))
    tok = AutoTokenizer.from_pretrained(str(d))
    for text in ["37+45=82", "a b\nc", "0"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == tokenizer.encode(text)
        assert tok.decode(ids) == text == tokenizer.decode(ids)
    assert tok.eos_token_id == tokenizer.EOS
    # a chat request is the completion of its messages' text (OpenAI chat clients; no template: a 400 in SGLang)
    shipped = AutoTokenizer.from_pretrained(str(DEFAULT_DIR))  # data/tiny-mimo, the pretrained checkpoint
    for t in (tok, shipped):
        chat = [{"role": "user", "content": "37+45="}]
        assert t.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == "37+45="


def test_arith_task():
    ps = arith.problems(50, seed=3)
    assert ps == arith.problems(50, seed=3)
    p = ps[0]
    a, b = p.prompt[:-1].split("+")
    assert int(p.answer) == int(a) + int(b)
    assert arith.reward(p, p.answer) == 1.0 and arith.reward(p, p.answer + "1") == 0.0
    tokens, mask = arith.batch(ps[:4])
    assert tokens.shape == mask.shape and mask.sum() == sum(len(q.answer) + 1 for q in ps[:4])
    with pytest.raises(ValueError, match="n=0"):
        arith.problems(0)


@pytest.mark.parametrize("family,change,field", [
    ("qwen3-moe-tiny", {"mlp_only_layers": [0]}, "mlp_only_layers=[0]"),  # valid in transformers
    ("qwen3-moe-tiny", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
])
def test_a_family_variant_labkit_cannot_serve_is_refused_naming_the_field(tmp_path, monkeypatch, family, change,
                                                                         field):
    from labkit.engine import EngineError, check_model_dir
    from labkit.models.families import make_family
    from labkit.workbench import Workbench, core

    monkeypatch.setattr(core.runtime, "init", lambda *a, **k: pytest.fail("the Workbench started Ray"))

    d = make_family(family, tmp_path / family)
    cfg = json.loads((d / "config.json").read_text())
    read_config_json(d)  # the preset itself is served
    (d / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=re.escape(field) + " in .*config.json is not supported"):
        read_config_json(d)  # the trainer's check
    with pytest.raises(EngineError, match=re.escape(field) + " in .*config.json is not supported"):
        check_model_dir(str(d))  # the engine's, before its actor starts
    with pytest.raises(ValueError, match=re.escape(field)):
        Workbench(str(d), progress=False)  # before Ray starts
