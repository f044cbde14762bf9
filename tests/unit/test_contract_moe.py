"""The engine contract for the model families: MoE experts (SGLang's FusedMoE w13/w2), DeepSeek's MLA pair, and
the FFN widths a CPU engine pads. Each engine layout here is the one the feasibility run read off a live SGLang
0.5.23 engine; the integration tests (test_families.py) check the same against one."""

import random

import pytest
import torch

from labkit.engine.contract import engine_shape, ffn_padding, fused_part, part_counts, plan_group
from labkit.models.families import FamilySpec, init_weights, tensor_shapes
from labkit.sync.plan import TensorMeta, plan_buckets
from labkit.sync.verify import Expected, engine_layout, expected_checksums, padded


def test_expert_slices_map_to_fused_moe_rows():
    p = "model.layers.3.mlp.experts"
    assert fused_part(f"{p}.5.gate_proj.weight") == (f"{p}.w13_weight", 10, None)
    assert fused_part(f"{p}.5.up_proj.weight") == (f"{p}.w13_weight", 11, None)
    assert fused_part(f"{p}.5.down_proj.weight") == (f"{p}.w2_weight", 5, None)
    shared = "model.layers.3.mlp.shared_experts.gate_proj.weight"  # DeepSeek's shared expert: a plain MLP
    assert fused_part(shared) == ("model.layers.3.mlp.shared_experts.gate_up_proj.weight", 0, 2)
    assert plan_group(f"{p}.5.gate_proj.weight") == f"{p}.5.gate_proj.weight"  # an expert slice loads alone
    a = "model.layers.1.self_attn"
    assert {plan_group(f"{a}.{n}.weight") for n in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")} == \
        {f"{a}.fused_qkv_a_proj_with_mqa.weight"}
    assert plan_group(f"{a}.kv_b_proj.weight") == f"{a}.kv_b_proj.weight"


@pytest.mark.parametrize("family", ["qwen3-moe-tiny", "deepseek-v3"])
def test_engine_layout_stacks_experts_as_fused_moe_does(family):
    spec = FamilySpec(dense_layers=1 if family == "deepseek-v3" else 0)
    named = init_weights(family, spec)
    layout = engine_layout(named)
    w13, w2 = layout["model.layers.1.mlp.experts.w13_weight"], layout["model.layers.1.mlp.experts.w2_weight"]
    e = "model.layers.1.mlp.experts"
    want13 = torch.stack([torch.cat([named[f"{e}.{i}.gate_proj.weight"], named[f"{e}.{i}.up_proj.weight"]])
                          for i in range(spec.experts)])  # FusedMoE's [E, 2I, H]
    want2 = torch.stack([named[f"{e}.{i}.down_proj.weight"] for i in range(spec.experts)])  # [E, H, I]
    assert torch.equal(w13.view_as(want13), want13) and torch.equal(w2.view_as(want2), want2)
    counts = part_counts(named)
    assert counts[f"{e}.w13_weight"] == 2 * spec.experts and counts[f"{e}.w2_weight"] == spec.experts
    if family == "deepseek-v3":
        a = "model.layers.1.self_attn"
        assert torch.equal(layout[f"{a}.fused_qkv_a_proj_with_mqa.weight"],
                           torch.cat([named[f"{a}.q_a_proj.weight"], named[f"{a}.kv_a_proj_with_mqa.weight"]]))


@pytest.mark.parametrize("seed", range(20))
def test_checksums_over_buckets_in_any_split_equal_the_whole_layout(seed):
    """Expected hashes a layer's experts as a running sha256 over buckets; any bucket size, any FFN width a CPU
    engine pads, tensors in any order within a bucket, must give the hash of the engine's whole padded parameter."""
    rng = random.Random(seed)
    experts, ffn, bucket = rng.randint(1, 6), rng.randint(1, 70), rng.randint(1, 40)
    spec = FamilySpec(layers=1, hidden=8, heads=2, kv_heads=1, head_dim=4, experts=experts, top_k=1, moe_ffn=ffn,
                      ffn=ffn, vocab=100, seed=seed)
    named = init_weights("qwen3-moe-tiny", spec)
    metas = [TensorMeta(n, tuple(t.shape), "float32") for n, t in named.items()]
    plan = plan_buckets(metas, bucket * 256)
    acc = Expected(part_counts(named), ffn_pad=32)
    for b in plan.buckets:
        names = list(b.names)
        rng.shuffle(names)
        acc.add({n: named[n] for n in names})
    assert acc.finish() == expected_checksums(named, ffn_pad=32)


def test_ffn_padding_follows_sglang_cpu_and_keeps_the_true_extent_first():
    assert ffn_padding("cpu") == 32 and ffn_padding("cpu", tp=2) == 64 and ffn_padding("cuda") == 1
    e = "model.layers.0.mlp.experts.3"
    assert engine_shape(f"{e}.gate_proj.weight", (16, 32), 32) == (32, 32)
    assert engine_shape(f"{e}.down_proj.weight", (32, 16), 32) == (32, 32)
    assert engine_shape("model.layers.0.mlp.down_proj.weight", (64, 200), 32) == (64, 224)
    assert engine_shape("model.layers.0.mlp.down_proj.weight", (64, 200), 1) == (64, 200)  # a GPU engine
    assert engine_shape("model.layers.0.self_attn.o_proj.weight", (64, 200), 32) == (64, 200)
    assert engine_shape("lm_head.weight", (131, 64), 32) == (192, 64)
    t = torch.randn(16, 8)
    p = padded(f"{e}.up_proj.weight", t, 32)
    assert p.shape == (32, 8) and torch.equal(p[:16], t) and not p[16:].any()
    d = padded(f"{e}.down_proj.weight", t.T.contiguous(), 32)
    assert d.shape == (8, 32) and torch.equal(d[:, :16], t.T) and not d[:, 16:].any()


def test_an_incomplete_expert_group_cannot_verify():
    named = init_weights("qwen3-moe-tiny")
    names = [n for n in named if ".experts." in n]
    random.Random(0).shuffle(names)
    acc = Expected(part_counts(named))
    acc.add({n: named[n] for n in names[1:]})  # one slice never sent
    got = acc.finish()
    want = expected_checksums(named)
    assert sum(got[k] != want[k] for k in got if k in want) == 1
    with pytest.raises(ValueError, match="how many tensors fill 'model.layers.0.mlp.experts.w2_weight' is unknown"):
        Expected().add({"model.layers.0.mlp.experts.0.down_proj.weight": named[names[0]]})


def test_every_family_checkpoint_fills_each_fused_parameter():
    for family in ("qwen3", "qwen3-moe", "deepseek-v3"):
        shapes = tensor_shapes(family)
        sizes = {fused_part(n)[0]: fused_part(n)[2] for n in shapes if fused_part(n)}
        for key, n in part_counts(shapes).items():
            want = sizes[key] or (2 if key.endswith(".w13_weight") else 1) * FamilySpec().experts
            if family == "qwen3-moe" and sizes[key] is None:
                want = want // FamilySpec().experts * 84  # the 4,179-tensor preset: 84 experts per layer
            assert n == want, (family, key)


def _random_spec(rng: random.Random, family: str) -> FamilySpec:
    heads, layers = rng.choice([1, 2, 3, 4, 6]), rng.randint(1, 3)
    return FamilySpec(hidden=rng.randint(4, 40), layers=layers, heads=heads,
                      kv_heads=rng.choice([d for d in range(1, heads + 1) if heads % d == 0]),
                      head_dim=2 * rng.randint(1, 8), ffn=rng.randint(1, 90), experts=rng.randint(1, 5), top_k=1,
                      moe_ffn=rng.randint(1, 70), vocab=rng.randint(100, 300), q_lora=rng.randint(1, 20),
                      kv_lora=rng.randint(1, 20), rope_head_dim=2 * rng.randint(1, 4),
                      dense_layers=rng.randint(0, min(1, layers - 1)) if family == "deepseek-v3" else 0,
                      seed=rng.randint(0, 99))


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe-tiny", "deepseek-v3"])
@pytest.mark.parametrize("seed", range(8))
def test_engine_layout_of_random_odd_sizes_has_sglang_cpu_shapes(family, seed):
    """Over random odd sizes of every family: the verifier's engine layout has the shapes a CPU SGLang engine
    allocates (written here from SGLang's rules, not from labkit's), padding is zero, and checksums built bucket by
    bucket equal the whole layout's."""
    rng = random.Random(seed)
    s = _random_spec(rng, family)
    named = init_weights(family, s)
    layout = engine_layout(named, ffn_pad=32)
    pad32 = lambda n: -(-n // 32) * 32  # noqa: E731
    assert layout["model.embed_tokens.weight"].shape == (-(-s.vocab // 64) * 64, s.hidden)
    for i in range(s.layers):
        p = f"model.layers.{i}"
        dense = family == "qwen3" or i < s.dense_layers
        if family != "deepseek-v3":
            qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
            assert layout[f"{p}.self_attn.qkv_proj.weight"].shape == (qkv, s.hidden)
        else:
            a = layout[f"{p}.self_attn.fused_qkv_a_proj_with_mqa.weight"]
            assert a.shape == (s.q_lora + s.kv_lora + s.rope_head_dim, s.hidden)
        if dense:
            assert layout[f"{p}.mlp.gate_up_proj.weight"].shape == (2 * pad32(s.ffn), s.hidden)
            assert layout[f"{p}.mlp.down_proj.weight"].shape == (s.hidden, pad32(s.ffn))
            assert not layout[f"{p}.mlp.down_proj.weight"][:, s.ffn:].any()
        else:
            w13 = layout[f"{p}.mlp.experts.w13_weight"].view(s.experts, 2 * pad32(s.moe_ffn), s.hidden)
            w2 = layout[f"{p}.mlp.experts.w2_weight"].view(s.experts, s.hidden, pad32(s.moe_ffn))
            assert not w13[:, s.moe_ffn:pad32(s.moe_ffn)].any() and not w2[:, :, s.moe_ffn:].any()
            e = 3 % s.experts
            assert torch.equal(w13[e, :s.moe_ffn], named[f"{p}.mlp.experts.{e}.gate_proj.weight"])
    metas = [TensorMeta(n, tuple(t.shape), "float32") for n, t in named.items()]
    acc = Expected(part_counts(named), ffn_pad=32)
    for b in plan_buckets(metas, rng.randint(1, 64) * 128).buckets:
        acc.add({n: named[n] for n in b.names})
    assert acc.finish() == expected_checksums(named, ffn_pad=32)


def test_mla_without_a_q_lora_fuses_neither_q_nor_kv_a():
    """Moonlight: `self_attn.q_proj` is a parameter of its own (not a part of q/k/v, as Qwen's name is) and
    kv_a_proj_with_mqa has no q_a to pair with; every other fused group is as in DeepSeek-V3."""
    from labkit.engine.contract import call_group, standalone
    from labkit.models.naming import hf_tensors
    from labkit.models.real import DEEPSEEK_V3, MOONLIGHT_16B_A3B, QWEN3_30B_A3B

    names = list(tensor_shapes("moonlight"))
    alone = standalone(names)
    attn = [f"model.layers.{i}.self_attn" for i in range(2)]
    assert alone == {f"{a}.{p}.weight" for a in attn for p in ("q_proj", "kv_a_proj_with_mqa")}
    assert all(fused_part(n, alone) is None and plan_group(n, alone) == n == call_group(n, alone) for n in alone)
    assert fused_part(f"{attn[0]}.q_proj.weight") == (f"{attn[0]}.qkv_proj.weight", 0, 3)
    counts = part_counts(names)
    assert not any("qkv" in k for k in counts) and counts["model.layers.1.mlp.experts.w13_weight"] == 12
    named = init_weights("moonlight")
    layout = engine_layout(named)
    assert all(torch.equal(layout[n], named[n]) for n in alone)
    assert not any(k.endswith(("qkv_proj.weight", "fused_qkv_a_proj_with_mqa.weight")) for k in layout)
    # the real configs: Moonlight's 27 layers are all plain; DeepSeek-V3's and Qwen3's names have nothing alone
    assert len(standalone(n for n, _ in hf_tensors(MOONLIGHT_16B_A3B))) == 2 * 27
    assert standalone(n for n, _ in hf_tensors(DEEPSEEK_V3)) == standalone(n for n, _ in hf_tensors(QWEN3_30B_A3B))
    assert not standalone(n for n, _ in hf_tensors(DEEPSEEK_V3))
    plan = plan_buckets([TensorMeta(n, tuple(t.shape), "float32") for n, t in named.items()], 1)
    assert all(len(b.tensors) == 1 for b in plan.buckets if b.tensors[0].name in alone)
