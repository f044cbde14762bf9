"""The SGLang speculative (MTP draft) engine option: validated on construction, GPU only."""

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


def test_speculative_engine_is_refused_on_cpu_with_the_reason():
    with pytest.raises(ValueError, match="GPU only"):
        EngineConfig(model_dir="m", speculative=SpeculativeConfig()).sglang_kwargs("cpu")
