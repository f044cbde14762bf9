"""Block FP8 on the way to the engine, without an engine: the recipe (labkit.models.fp8), what the contract reads
from an FP8 checkpoint, and the sync layer's planning of a bf16 export into it (labkit.sync.quantize, plan). The
engine side (SGLang serving the checkpoint, a sync verified in bytes) is tests/integration/test_fp8.py."""

import pytest
import torch

from labkit.engine.contract import Contract, ContractMismatch, fused_part, part_counts, plan_group
from labkit.models import fp8
from labkit.models.families import family_model_dir
from labkit.models.fp8 import MASTER
from labkit.sync import quantize
from labkit.sync.config import SyncConfig
from labkit.sync.plan import TensorMeta, check_coverage, make_plan, metas_of, planned_dtype


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [(128, 128), (300, 200), (7, 130), (256, 64)])
def test_quantize_is_deterministic_and_within_e4m3s_rounding_of_every_element(seed, shape):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * 10 ** (seed % 4 - 2)
    q, s = fp8.quantize(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert tuple(s.shape) == fp8.scale_shape(shape) and tuple(q.shape) == shape
    q2, s2 = fp8.quantize(w.clone())
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    back = fp8.dequantize(q, s)
    scale = s.repeat_interleave(128, 0)[: shape[0]].repeat_interleave(128, 1)[:, : shape[1]]
    # e4m3: 3 mantissa bits, so rounding is at most 1/16 of the value; below 2^-6 (in units of the scale) the
    # subnormal spacing 2^-9 rules, half of it at most
    assert bool(((back - w).abs() <= w.abs() / 16 + scale * 2**-10 + 1e-12).all())
    amax = w.abs().max()
    assert torch.isclose(back.abs().max(), amax, rtol=1 / 16)  # each block's largest element maps to 448


def test_a_zero_block_has_scale_one_and_power_of_two_scales_cover_the_block():
    w = torch.zeros(256, 128)
    w[128:] = torch.randn(128, 128)
    q, s = fp8.quantize(w)
    assert s[0, 0] == 1.0 and not q[:128].float().any()
    qp, sp = fp8.quantize(w, pow2_scales=True)
    assert torch.equal(torch.exp2(torch.log2(sp).round()), sp)  # exponent only (UE8M0)
    assert sp[1, 0] >= w[128:].abs().max() / fp8.E4M3_MAX and bool(qp.float().abs().max() <= fp8.E4M3_MAX)


def test_stacked_experts_dequantize_like_each_expert_alone():
    w = torch.randn(3, 256, 128)
    pairs = [fp8.quantize(w[e]) for e in range(3)]
    q, s = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    assert torch.equal(fp8.dequantize(q, s), torch.stack([fp8.dequantize(*p) for p in pairs]))


@pytest.mark.parametrize("name,shape,expected", [
    ("model.layers.0.mlp.gate_proj.weight", (256, 128), True),
    ("model.layers.0.mlp.experts.3.up_proj.weight", (128, 128), True),
    ("model.layers.0.self_attn.o_proj.weight", (128, 256), True),
    ("model.layers.0.mlp.gate.weight", (4, 128), False),  # a router (NeMo-RL #3614)
    ("model.layers.0.mlp.shared_expert_gate.weight", (1, 128), False),
    ("model.layers.0.mlp.shared_experts.gate_proj.weight", (256, 128), True),
    ("model.layers.0.mlp.gate.e_score_correction_bias", (4,), False),
    ("model.layers.0.self_attn.q_norm.weight", (128,), False),
    ("model.layers.1.self_attn.kv_a_layernorm.weight", (32,), False),
    ("model.embed_tokens.weight", (128, 128), False),
    ("lm_head.weight", (128, 128), False),
    ("model.layers.0.self_attn.q_proj.bias", (256,), False),
])
def test_what_stays_unquantized_is_declared(name, shape, expected):
    assert fp8.quantizable(name, shape) is expected
    assert not fp8.quantizable("model.layers.0.mlp.down_proj.weight", (128, 256), ("model.layers.0.mlp",))


@pytest.fixture(scope="module")
def moe_fp8(tmp_path_factory):
    return family_model_dir("qwen3-moe-fp8", tmp_path_factory.mktemp("fp8"))


def test_the_contract_of_an_fp8_checkpoint_holds_its_weights_and_scales_as_the_headers_say(moe_fp8):
    c = Contract.from_model_dir(moe_fp8)
    assert c.dtype == "bfloat16" and c.quant == {"block": (128, 128), "pow2_scales": False, "not_converted": ()}
    attn, experts = "model.layers.0.self_attn", "model.layers.0.mlp.experts"
    assert c.tensors[f"{attn}.q_proj.weight"] == ((256, 128), "float8_e4m3fn")
    assert c.tensors[f"{attn}.q_proj.weight_scale_inv"] == ((2, 1), "float32")
    assert c.tensors["model.layers.0.mlp.gate.weight"][1] == "bfloat16"  # the router stays
    assert c.tensors[f"{attn}.q_norm.weight"][1] == "bfloat16"
    assert fused_part(f"{attn}.k_proj.weight_scale_inv") == (f"{attn}.qkv_proj.weight_scale_inv", 1, 3)
    assert fused_part(f"{experts}.2.up_proj.weight_scale_inv") == (f"{experts}.w13_weight_scale_inv", 5, None)
    assert fused_part(f"{experts}.2.down_proj.weight_scale_inv") == (f"{experts}.w2_weight_scale_inv", 2, None)
    assert part_counts(c.tensors)[f"{experts}.w13_weight_scale_inv"] == 8
    for name in c.tensors:  # a scale plans with its weight
        if name.endswith(fp8.SCALE_SUFFIX):
            assert plan_group(name) == plan_group(fp8.weight_of(name))
    master = Contract.from_model_dir(f"{moe_fp8}/{MASTER}")
    assert master.quant is None and set(master.tensors) == {n for n in c.tensors if not n.endswith("_scale_inv")}


def _export(moe_fp8):
    from safetensors.torch import load_file

    return list(load_file(f"{moe_fp8}/{MASTER}/model.safetensors").items())


def test_a_bf16_export_is_quantized_on_the_way_and_each_scale_rides_in_its_weights_bucket(moe_fp8):
    c = Contract.from_model_dir(moe_fp8)
    phases = {"gather": 0.0}
    sent = list(quantize.on_the_way(iter(_export(moe_fp8)), c.tensors, c.quant, phases))
    assert {n for n, _ in sent} == set(c.tensors) and phases["quantize"] > 0 > phases["gather"]
    names = [n for n, _ in sent]
    for i, n in enumerate(names):
        if n.endswith(fp8.SCALE_SUFFIX):
            assert names[i - 1] == fp8.weight_of(n)
    plan = make_plan(metas_of(sent), SyncConfig(bucket_mb=0.05), c.dtype, c.tensors)
    assert check_coverage(plan, c.tensors) == []
    bucket_of = {t.name: b.index for b in plan.buckets for t in b.tensors}
    assert len(plan.buckets) > 3
    assert all(bucket_of[n] == bucket_of[fp8.weight_of(n)] for n in bucket_of if n.endswith(fp8.SCALE_SUFFIX))
    q = dict(sent)["model.layers.0.mlp.experts.1.gate_proj.weight"]
    assert q.dtype == torch.float8_e4m3fn


def test_no_float_is_cast_into_or_out_of_fp8_and_the_contract_names_the_tensor_and_both_dtypes(moe_fp8):
    c = Contract.from_model_dir(moe_fp8)
    name = "model.layers.0.mlp.experts.0.up_proj.weight"
    assert planned_dtype(TensorMeta(name, (128, 128), "bfloat16"), "bfloat16", c.tensors) == "bfloat16"
    assert planned_dtype(TensorMeta(name, (128, 128), "float32"), "bfloat16", c.tensors) == "float32"
    router = "model.layers.0.mlp.gate.weight"
    assert planned_dtype(TensorMeta(router, (4, 128), "float8_e4m3fn"), "bfloat16", c.tensors) == "float8_e4m3fn"
    assert planned_dtype(TensorMeta(router, (4, 128), "float32"), "bfloat16", c.tensors) == "bfloat16"
    # the field's failures: gate quantized and up left in bf16 (verl #7519); a router quantized (NeMo-RL #3614)
    export = dict(_export(moe_fp8))
    sent = dict(quantize.on_the_way(iter(export.items()), c.tensors, c.quant))
    sent[name] = export[name].to(torch.bfloat16)
    with pytest.raises(ContractMismatch, match=rf"'{name}': dtype bfloat16 != engine float8_e4m3fn"):
        check_coverage(make_plan(metas_of(sent.items()), SyncConfig(), c.dtype, c.tensors), c.tensors)
    sent = dict(quantize.on_the_way(iter(export.items()), c.tensors, c.quant))
    sent[router] = fp8.quantize(export[router])[0]
    with pytest.raises(ContractMismatch, match=rf"'{router}': dtype float8_e4m3fn != engine bfloat16"):
        check_coverage(make_plan(metas_of(sent.items()), SyncConfig(), c.dtype, c.tensors), c.tensors)


@pytest.mark.parametrize("drop", ["weight", "scale"])
def test_a_weight_without_its_scale_or_a_scale_without_its_weight_is_refused_even_when_excluded(moe_fp8, drop):
    c = Contract.from_model_dir(moe_fp8)
    sent = dict(quantize.on_the_way(iter(_export(moe_fp8)), c.tensors, c.quant))
    name = "model.layers.1.self_attn.o_proj.weight"
    gone = name if drop == "weight" else fp8.scale_name(name)
    del sent[gone]
    plan = make_plan(metas_of(sent.items()), SyncConfig(), c.dtype, c.tensors)
    with pytest.raises(ValueError, match="without their other half"):
        check_coverage(plan, c.tensors, exclude=(gone,), n_excluded=1)


def test_a_trainer_loads_the_unquantized_original_and_an_fp8_checkpoint_without_one_is_refused(moe_fp8, tmp_path):
    import shutil

    assert fp8.master_dir(moe_fp8) == (f"{moe_fp8}/{MASTER}", True)
    assert fp8.master_dir(f"{moe_fp8}/{MASTER}") == (f"{moe_fp8}/{MASTER}", False)
    alone = tmp_path / "alone"
    shutil.copytree(moe_fp8, alone, ignore=shutil.ignore_patterns(MASTER))
    with pytest.raises(FileNotFoundError, match="block-FP8 checkpoint without its unquantized original"):
        fp8.master_dir(alone)


def test_fp8_tensors_cross_to_the_engine_actor_as_bytes_because_plain_pickle_cannot_load_them():
    import pickle

    from labkit.engine.ipc import from_ray, to_ray

    q = fp8.quantize(torch.randn(130, 70))[0]
    with pytest.raises(AttributeError, match="has no attribute 'dtype'"):  # torch 2.14, what Ray's pickle meets
        pickle.loads(pickle.dumps(q))
    payload = [("w", q), ("norm", torch.randn(3))]
    back = from_ray(pickle.loads(pickle.dumps(to_ray(payload))))
    assert back[0][1].dtype == torch.float8_e4m3fn and torch.equal(back[0][1].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(back[1][1], payload[1][1])
