"""A bf16 trainer's weights into a block-FP8 engine, on the real stack: labkit's Megatron trainer holds the
unquantized original of the FP8 Qwen3-MoE preset, the real SGLang engine on CPU (labkit's torch-native FP8
layer, labkit.engine.inside.fp8_cpu) serves the FP8 checkpoint (fp8 attention, dense and expert weights; bf16
router, norms and vocabulary). Each sync is quantized on the way and checked in bytes (the fp8 weights and the
scales hashed as held), in behaviour (the probe: the trainer scores what the engine samples) and against a twin
engine that holds the same weights dequantized in bf16 (greedy output equal). The refusal the field lacks: a
bf16 tensor sent into an fp8 parameter is refused by name, not cast."""

import pytest
import torch

from labkit.engine.contract import Contract, ContractMismatch
from labkit.models import fp8
from labkit.models.families import family_model_dir
from labkit.sync import SyncConfig, stream
from labkit.sync import verify as vf
from labkit.sync.atomic import SyncFailed
from labkit.sync.quantize import on_the_way
from tests.integration.conftest import engine_config

pytestmark = pytest.mark.integration

GREEDY = {"max_new_tokens": 12, "temperature": 0.0}
FAST = dict(bucket_mb=0.05, progress=False, timeout_s=60.0, deadline_s=120.0)


def _dequantized(named: dict) -> dict:
    """The bf16 tensors a (weight, scale) checkpoint stands for: what the twin engine serves."""
    out = {}
    for n, t in named.items():
        if not n.endswith(fp8.SCALE_SUFFIX):
            scale = named.get(n + fp8.SCALE_SUFFIX)
            out[n] = (fp8.dequantize(t, scale) if scale is not None else t).to(torch.bfloat16)
    return out


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """(Workbench on the FP8 preset, its bf16 twin engine, the FP8 model dir)."""
    from safetensors.torch import load_file, save_file

    from labkit.engine import EngineHandle
    from labkit.models.tiny import save_weights_as
    from labkit.workbench import Workbench

    model_dir = family_model_dir("qwen3-moe-fp8", tmp_path_factory.mktemp("fp8"))
    twin_dir = save_weights_as(f"{model_dir}/{fp8.MASTER}", tmp_path_factory.mktemp("twin"), {})
    save_file(_dequantized(load_file(f"{model_dir}/model.safetensors")), str(twin_dir / "model.safetensors"))
    with Workbench(model_dir, progress=False) as wb:
        twin = EngineHandle.start(engine_config(twin_dir, dtype="bfloat16"))
        try:
            yield wb, twin, model_dir
        finally:
            twin.shutdown()


def _greedy(engine, ids) -> list[list[int]]:
    return [o["tokens"] for o in engine.generate(input_ids=ids, sampling=GREEDY)]


def test_a_bf16_trainer_syncs_into_an_fp8_engine_verified_in_bytes_and_behaviour(bench):
    wb, twin, model_dir = bench
    assert wb.engine.cfg.dtype == "bfloat16" and wb.trainer.model_dir.endswith(fp8.MASTER)
    ids = [[5, 17, 33, 40], [60, 2, 9], [77, 78, 79, 80, 81]]
    assert _greedy(wb.engine, ids) == _greedy(twin, ids)  # the torch-native layer computes what bf16 does
    wb.train(steps=2, progress=False)
    c = Contract.from_model_dir(model_dir, "bfloat16")
    for transport in ("colocated", "distributed"):
        m = wb.sync(SyncConfig(transport=transport, probe=8, **FAST), weight_version=transport)
        assert m["sync/verified"] is True and m["timing/sync/quantize"] > 0, m
        assert 0 <= m["sync/probe_kl"] < SyncConfig().probe_kl_max and m["sync/probe_tokens"] == 32, m
        sent = dict(on_the_way(iter(wb.trainer.export()), c.tensors, c.quant))
        assert wb.engine.checksums() == vf.expected_checksums(sent)  # fp8 bytes and scales, as held
    assert m["sync/bytes"] < 0.6 * sum(t.numel() * 2 for _, t in wb.trainer.export())  # bf16 would be 2 bytes each
    scale = "model.layers.1.self_attn.k_proj.weight_scale_inv"  # a fused scale's rows, read back
    assert torch.equal(wb.engine.get_weights_by_name(scale), sent[scale])
    stream(_dequantized(sent).items(), twin, SyncConfig(transport="colocated", **FAST))
    assert _greedy(wb.engine, ids) == _greedy(twin, ids)  # the synced weights serve as their dequantization


def test_a_probe_over_its_threshold_fails_the_sync_and_the_engine_serves_the_last_good_weights(bench):
    wb, _, _ = bench
    wb.sync(SyncConfig(**FAST))
    before, version = wb.engine.checksums(), wb.engine.weight_version
    wb.train(steps=1, progress=False)
    with pytest.raises(SyncFailed, match="behaviour probe failed: sync/probe_kl="):
        wb.sync(SyncConfig(probe=4, probe_kl_max=1e-12, **FAST))  # FP8 rounding alone is over this
    assert wb.engine.checksums() == before and wb.engine.weight_version == version


def test_a_bf16_tensor_for_an_fp8_parameter_is_refused_by_name_and_the_engine_keeps_its_weights(bench):
    wb, _, _ = bench
    name = "model.layers.0.mlp.experts.1.up_proj.weight"
    before = wb.engine.checksums()
    wb.engine.begin_weight_update()
    try:
        with pytest.raises(ContractMismatch, match=rf"'{name}': dtype bfloat16 != engine float8_e4m3fn"):
            wb.engine.update_weights_from_tensor([(name, torch.zeros(128, 128, dtype=torch.bfloat16))])
    finally:
        wb.engine.end_weight_update()
    assert wb.engine.checksums() == before
