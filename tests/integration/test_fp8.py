"""A bf16 trainer's weights into a block-FP8 engine: the real SGLang engine on CPU (labkit's torch-native FP8
layer, labkit.engine.inside.fp8_cpu) serving labkit's FP8 Qwen3-MoE preset (fp8 attention, dense and expert
weights; bf16 router, norms and vocabulary), checked in behaviour against a twin engine that holds the same
weights dequantized in bf16, and in bytes by labkit's verification (the fp8 weights and the scales hashed as
held). The refusal the field lacks: a bf16 tensor sent into an fp8 parameter is refused by name, not cast."""

import pytest
import torch

from labkit.engine.contract import Contract, ContractMismatch
from labkit.models import fp8
from labkit.models.families import family_model_dir
from labkit.models.fp8 import MASTER
from labkit.sync import SyncConfig, stream
from labkit.sync import verify as vf
from labkit.sync.quantize import on_the_way
from tests.integration.conftest import engine_config

pytestmark = pytest.mark.integration

PROMPTS = ["12+7=", "3*4=", "hello", "99-1="]
GREEDY = {"max_new_tokens": 12, "temperature": 0.0}
FAST = dict(bucket_mb=0.05, progress=False, timeout_s=60.0, deadline_s=120.0)


def _load(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _dequantized(named: dict) -> dict:
    """The bf16 tensors a (weight, scale) checkpoint stands for: what the twin engine serves."""
    out = {}
    for n, t in named.items():
        if n.endswith(fp8.SCALE_SUFFIX):
            continue
        scale = named.get(n + fp8.SCALE_SUFFIX)
        out[n] = (fp8.dequantize(t, scale) if scale is not None else t).to(torch.bfloat16)
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(fp8 engine, bf16 twin, fp8 model dir): the twin's checkpoint holds the fp8 checkpoint dequantized."""
    from safetensors.torch import save_file

    from labkit.cluster import runtime
    from labkit.engine import EngineHandle
    from labkit.models.tiny import save_weights_as

    model_dir = family_model_dir("qwen3-moe-fp8", tmp_path_factory.mktemp("fp8"))
    twin_dir = save_weights_as(f"{model_dir}/{MASTER}", tmp_path_factory.mktemp("twin"), {})
    save_file(_dequantized(_load(f"{model_dir}/model.safetensors")), str(twin_dir / "model.safetensors"))
    runtime.init()
    engine = EngineHandle.start(engine_config(model_dir, dtype="bfloat16"))
    twin = EngineHandle.start(engine_config(twin_dir, dtype="bfloat16"))
    try:
        yield engine, twin, model_dir
    finally:
        engine.shutdown()
        twin.shutdown()


def _greedy(engine) -> list[list[int]]:
    return [o["tokens"] for o in engine.generate(PROMPTS, sampling=GREEDY)]


def test_an_fp8_engine_serves_what_its_dequantized_twin_serves_and_a_bf16_export_lands_quantized(engines):
    engine, twin, model_dir = engines
    assert _greedy(engine) == _greedy(twin)
    g = torch.Generator().manual_seed(7)
    master = {n: (t.float() + 0.05 * torch.randn(t.shape, generator=g)).to(torch.bfloat16)
              for n, t in _load(f"{model_dir}/{MASTER}/model.safetensors").items()}
    for transport in ("colocated", "distributed"):
        m = stream(master.items(), engine, SyncConfig(transport=transport, **FAST), weight_version=transport)
        assert m["sync/verified"] is True and m["timing/sync/quantize"] > 0, m
        c = Contract.from_model_dir(model_dir, "bfloat16")
        sent = dict(on_the_way(iter(master.items()), c.tensors, c.quant))
        assert engine.checksums() == vf.expected_checksums(sent)  # the fp8 bytes and the scales, as held
        assert sum(t.nbytes for t in sent.values()) < 0.6 * sum(t.nbytes for t in master.values())
    scale = "model.layers.1.self_attn.k_proj.weight_scale_inv"  # a fused scale's rows, read back
    assert torch.equal(engine.get_weights_by_name(scale), sent[scale])
    stream(_dequantized(sent).items(), twin, SyncConfig(transport="colocated", **FAST))
    assert _greedy(engine) == _greedy(twin)  # the new weights serve as their dequantization does


def test_a_bf16_tensor_for_an_fp8_parameter_is_refused_by_name_and_the_engine_keeps_its_weights(engines):
    engine, _, model_dir = engines
    name = "model.layers.0.mlp.experts.1.up_proj.weight"
    before = engine.checksums()
    bf16 = fp8.dequantize(*[_load(f"{model_dir}/model.safetensors")[k] for k in (name, fp8.scale_name(name))])
    engine.begin_weight_update()
    try:
        with pytest.raises(ContractMismatch, match=rf"'{name}': dtype bfloat16 != engine float8_e4m3fn"):
            engine.update_weights_from_tensor([(name, bf16.to(torch.bfloat16))])
    finally:
        engine.end_weight_update()
    assert engine.checksums() == before
