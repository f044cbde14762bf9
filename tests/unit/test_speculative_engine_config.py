"""The SGLang speculative (MTP draft) engine option: validated on construction; on CPU, top-k 1 chains."""

import pytest

from labkit.engine.config import EngineConfig, SpeculativeConfig


def test_mimo_recipe_maps_to_sglang_server_args():
    kw = EngineConfig(model_dir="m", speculative=SpeculativeConfig()).sglang_kwargs("cuda")
    assert kw["speculative_algorithm"] == "NEXTN" and kw["speculative_num_steps"] == 1
    assert kw["speculative_eagle_topk"] == 1 and kw["speculative_num_draft_tokens"] == 2
    assert kw["speculative_draft_model_path"] == "m"  # the MTP layer ships in the target's directory
    flags = EngineConfig(model_dir="m", speculative=SpeculativeConfig(num_steps=2, num_draft_tokens=3)).server_argv(
        "cuda", "127.0.0.1", 30000)
    assert flags[flags.index("--speculative-num-steps") + 1] == "2"


@pytest.mark.parametrize("bad, match", [
    (dict(algorithm="MEDUSA"), "speculative.algorithm='MEDUSA'"), (dict(num_steps=0), "speculative.num_steps=0"),
    (dict(num_steps=2), "speculative.num_draft_tokens=2"), (dict(eagle_topk=-1), "speculative.eagle_topk=-1"),
])
def test_bad_speculative_settings_name_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig(**bad)


def test_a_cpu_engine_takes_chains_and_refuses_a_tree_naming_the_value():
    chain = SpeculativeConfig(num_steps=2, num_draft_tokens=3)
    kw = EngineConfig(model_dir="m", speculative=chain).sglang_kwargs("cpu")
    assert kw["speculative_num_steps"] == 2
    tree = SpeculativeConfig(num_steps=2, eagle_topk=2, num_draft_tokens=4)
    assert EngineConfig(model_dir="m", speculative=tree).sglang_kwargs("cuda")["speculative_eagle_topk"] == 2
    with pytest.raises(ValueError, match="eagle_topk=2"):
        EngineConfig(model_dir="m", speculative=tree).sglang_kwargs("cpu")
