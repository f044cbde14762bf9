"""Unquantized weights into a block-FP8 engine, on the real SGLang engine on CPU (labkit's torch-native FP8 layer,
labkit.engine.inside.fp8_cpu) serving labkit's FP8 DeepSeek-V3 preset: MLA (its fused q_a/kv_a pair, and the
w_kc/w_vc the absorbed attention derives from kv_b_proj), a dense first layer, shared and routed experts, all in
fp8 with their block scales; router, its bias, norms and vocabulary in bf16. Each sync is quantized on the way and
checked in bytes (the fp8 weights and the scales hashed as held), against a twin engine that holds the same weights
dequantized in bf16 (greedy output equal), and in behaviour (the probe) against a transformers model of the
unquantized weights, which plays the trainer here; the Megatron trainer's FP8 syncs (Qwen3-MoE, DeepSeek-V3) with
the probe run through `labkit sync` in tests/integration/test_shm_cleanup.py. The failures the field reports
silently: a bf16 tensor sent into an fp8 parameter is refused by name, not cast; derived weights left stale verify
in bytes and fail the probe."""

import pytest
import torch

from labkit import failpoints as fp
from labkit.engine.contract import Contract, ContractMismatch
from labkit.models import fp8
from labkit.models.families import family_model_dir
from labkit.sync import SyncConfig, stream
from labkit.sync import verify as vf
from labkit.sync.atomic import SyncFailed, guard_for
from labkit.sync.producer import LocalProducer
from labkit.sync.quantize import on_the_way
from labkit.sync.spec import checked_expected
from tests.integration.conftest import engine_config

pytestmark = pytest.mark.integration

GREEDY = {"max_new_tokens": 12, "temperature": 0.0}
# The probe's limit for this preset against the transformers scorer: its own quantization KL reads 0.15-0.88 over
# the weights tried and stale w_kc/w_vc 1.7-4.2 (data/probe_stale_derived_cpu.json); labkit's default FP8 limit
# (0.25, from the Qwen3-MoE preset's calibration) sits inside that quantization spread.
PROBE_KL_MAX = 1.0
FAST = dict(bucket_mb=0.05, progress=False, timeout_s=60.0, deadline_s=120.0)
IDS = [[5, 17, 33, 40], [60, 2, 9], [77, 78, 79, 80, 81]]


def _load(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _dequantized(named: dict) -> dict:
    """The bf16 tensors a (weight, scale) checkpoint stands for: what the twin engine serves."""
    out = {}
    for n, t in named.items():
        if not n.endswith(fp8.SCALE_SUFFIX):
            scale = named.get(n + fp8.SCALE_SUFFIX)
            out[n] = (fp8.dequantize(t, scale) if scale is not None else t).to(torch.bfloat16)
    return out


class Scorer(LocalProducer):
    """A producer that can score tokens (what the probe needs of a trainer): the unquantized weights of a model
    dir, exported as they are, and a transformers model of them for `forward`."""

    def __init__(self, model_dir, named: list | None = None, model=None):
        from transformers import AutoModelForCausalLM

        super().__init__(named if named is not None else list(_load(f"{model_dir}/model.safetensors").items()))
        self.model = model or AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.no_grad()
    def forward(self, ids):
        return {"logits": self.model(ids).logits}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(FP8 engine, bf16 twin, FP8 model dir, a shifted copy of the unquantized original)."""
    from safetensors.torch import save_file

    from labkit.cluster import runtime
    from labkit.engine import EngineHandle
    from labkit.models.tiny import save_weights_as

    model_dir = family_model_dir("deepseek-v3-fp8", tmp_path_factory.mktemp("fp8"))
    master = f"{model_dir}/{fp8.MASTER}"
    twin_dir = save_weights_as(master, tmp_path_factory.mktemp("twin"), {})
    save_file(_dequantized(_load(f"{model_dir}/model.safetensors")), str(twin_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(7)
    shifted = save_weights_as(master, tmp_path_factory.mktemp("shifted"), {
        n: t + 0.05 * torch.randn(t.shape, generator=g) for n, t in _load(f"{master}/model.safetensors").items()})
    runtime.init()
    engine = EngineHandle.start(engine_config(model_dir, dtype="bfloat16"))
    twin = EngineHandle.start(engine_config(twin_dir, dtype="bfloat16"))
    try:
        yield engine, twin, model_dir, shifted
    finally:
        engine.shutdown()
        twin.shutdown()


def _greedy(engine) -> list[list[int]]:
    return [o["tokens"] for o in engine.generate(input_ids=IDS, sampling=GREEDY)]


def test_an_fp8_engine_serves_as_its_twin_and_a_shifted_model_lands_quantized_verified_in_bytes(engines):
    engine, twin, model_dir, shifted = engines
    assert _greedy(engine) == _greedy(twin)  # the torch-native layer computes what bf16 does with these weights
    master = _load(shifted / "model.safetensors")
    c = Contract.from_model_dir(model_dir, "bfloat16")
    sent = {n: t.to(getattr(torch, c.tensors[n][1]))  # each in the dtype the engine holds it in
            for n, t in on_the_way(iter(master.items()), c.tensors, c.quant)}
    for transport in ("colocated", "distributed"):
        m = stream(master.items(), engine, SyncConfig(transport=transport, **FAST), weight_version=transport)
        assert m["sync/verified"] is True and m["timing/sync/quantize"] > 0, m
        assert engine.checksums() == vf.expected_checksums(sent)  # the fp8 bytes and the scales, as held
    assert m["sync/bytes"] < 0.6 * sum(t.numel() * 2 for t in master.values())  # against bf16's 2 bytes each
    scale = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv"  # the fused a-pair's scale rows
    assert torch.equal(engine.get_weights_by_name(scale), sent[scale])
    stream(_dequantized(sent).items(), twin, SyncConfig(transport="colocated", **FAST))
    assert _greedy(engine) == _greedy(twin)  # the synced weights serve as their dequantization does


def test_the_probe_measures_the_quantizations_kl_and_over_its_threshold_the_guard_restores(engines):
    engine, _, _, shifted = engines
    scorer, guard = Scorer(shifted), guard_for(engine)
    m = guard.sync(scorer, SyncConfig(probe=8, probe_kl_max=PROBE_KL_MAX, **FAST), checked_expected(engine, ()),
                   "probed")
    assert m["sync/verified"] is True and m["sync/probe_tokens"] == 32
    assert 0 < m["sync/probe_kl"] < PROBE_KL_MAX, m  # fp8 rounding: never zero
    before, version = engine.checksums(), engine.weight_version
    shifted_again = [(n, t + 0.01) for n, t in scorer.named_tensors]
    with pytest.raises(SyncFailed, match="behaviour probe failed: sync/probe_kl="):
        guard.sync(Scorer(shifted, shifted_again, scorer.model), SyncConfig(probe=8, probe_kl_max=1e-9, **FAST),
                   checked_expected(engine, ()), "too-strict")
    assert engine.checksums() == before and engine.weight_version == version  # the last good weights, bitwise


def test_damaged_fp8_bytes_fail_verification_and_the_guard_restores_them(engines):
    engine, _, _, shifted = engines
    before, version = engine.checksums(), engine.weight_version
    named = [(n, t - 0.02) for n, t in _load(shifted / "model.safetensors").items()]
    fp.arm("transport.send", "corrupt", nth=2)  # the driver sends: armed in this process
    try:
        with pytest.raises(SyncFailed, match="verification failed") as e:
            stream(named, engine, SyncConfig(transport="colocated", **FAST))
        assert fp.disarm() == {"transport.send": 1}
    finally:
        fp.disarm()
    assert e.value.restored and engine.checksums() == before and engine.weight_version == version


def test_a_bf16_tensor_for_an_fp8_parameter_is_refused_by_name_and_the_engine_keeps_its_weights(engines):
    engine = engines[0]
    name = "model.layers.1.mlp.experts.1.up_proj.weight"
    before = engine.checksums()
    engine.begin_weight_update()
    try:
        with pytest.raises(ContractMismatch, match=rf"'{name}': dtype bfloat16 != engine float8_e4m3fn"):
            engine.update_weights_from_tensor([(name, torch.zeros(128, 128, dtype=torch.bfloat16))])
    finally:
        engine.end_weight_update()
    assert engine.checksums() == before


def test_derived_weights_left_stale_verify_in_bytes_and_fail_the_probe_and_the_guard_restores(engines, tmp_path):
    """The absorbed MLA reads w_kc/w_vc, which the engine derives from kv_b_proj after every apply
    (`labkit_after_apply`). With that step skipped (the `engine.derive` failpoint: NeMo-RL #3739's derived weights
    never refreshed), every byte of a sync that moves only kv_b_proj verifies, and generation keeps the old
    kv_b_proj: the probe sees it and the guard restores the last good weights."""
    engine, _, _, shifted = engines
    scorer, guard = Scorer(shifted), guard_for(engine)
    # one apply, so the skipped derivation covers every layer
    probed = SyncConfig(probe=8, probe_kl_max=PROBE_KL_MAX, **{**FAST, "bucket_mb": 8.0})
    guard.sync(scorer, probed, checked_expected(engine, ()), "before-kv-b")
    before, version = engine.checksums(), engine.weight_version
    from labkit.models.tiny import save_weights_as

    moved = save_weights_as(shifted, tmp_path / "moved", {  # only kv_b_proj changes: halved
        n: 0.5 * t if ".kv_b_proj." in n else t for n, t in scorer.named_tensors})
    marker = tmp_path / "derive_skipped"
    fp.arm_in_actor(engine._actor, "engine.derive", "skip", marker=str(marker))
    try:
        with pytest.raises(SyncFailed, match="behaviour probe failed") as e:
            guard.sync(Scorer(moved), probed, checked_expected(engine, ()), "stale-w-kc")
    finally:
        fp.disarm_in_actor(engine._actor)
    # the derivation was skipped and the probe failed, which it runs only after the bytes verified ("verification
    # failed" otherwise): the stale copies, not the bytes, are what the engine got wrong
    assert marker.exists()
    assert e.value.restored and engine.checksums() == before and engine.weight_version == version
    m = guard.sync(Scorer(moved), probed, checked_expected(engine, ()), "w-kc-derived")
    assert m["sync/verified"] is True and m["sync/probe_kl"] < PROBE_KL_MAX  # re-derived: the same sync lands
