"""What each engine rank holds at TP > 1 (labkit.engine.shard), and the per-rank expectation built from it."""

import random

import pytest
import torch

from labkit.engine.errors import EngineError, Unsupported
from labkit.engine.shard import Sharding, rank_checksums, rank_key
from labkit.sync.verify import Expected, compare, engine_layout, expected_checksums, on_ranks

L = "model.layers.0"
SPLIT = {f"{L}.self_attn.q_proj.weight": 0, f"{L}.self_attn.q_proj.bias": 0, f"{L}.self_attn.o_proj.weight": 1,
         f"{L}.mlp.gate_proj.weight": 0, f"{L}.mlp.up_proj.weight": 0, f"{L}.mlp.down_proj.weight": 1,
         f"{L}.mlp.experts.3.gate_proj.weight": 0, f"{L}.mlp.experts.3.down_proj.weight": 1,
         f"{L}.mlp.shared_experts.up_proj.weight": 0, f"{L}.self_attn.q_b_proj.weight": 0,
         f"{L}.self_attn.kv_b_proj.weight": 0, "model.embed_tokens.weight": 0, "lm_head.weight": 0}
WHOLE = [f"{L}.input_layernorm.weight", f"{L}.self_attn.q_norm.weight", f"{L}.mlp.gate.weight",
         f"{L}.mlp.gate.e_score_correction_bias", f"{L}.self_attn.kv_a_proj_with_mqa.weight",
         f"{L}.self_attn.q_a_proj.weight", f"{L}.self_attn.kv_a_layernorm.weight", "model.norm.weight",
         "model.mtp_layers.0.self_attn.q_proj.weight", "model.mtp_layers.0.mlp.down_proj.weight"]


@pytest.mark.parametrize("tp", [2, 4])
def test_every_split_tensors_pieces_tile_it_in_rank_order(tp):
    rng = random.Random(tp)
    s = Sharding(tp, heads=8, kv_heads=8)
    for name, dim in SPLIT.items():
        for _ in range(5):
            shape = [rng.randint(1, 6) * tp for _ in range(2 if not name.endswith("bias") else 1)]
            t = torch.randn(shape)
            pieces = s.pieces(name, tuple(shape))
            assert [p[0] for p in pieces] == [dim] * tp, name
            assert torch.equal(torch.cat([t.narrow(*p) for p in pieces], dim), t), name
    for name in WHOLE:
        assert s.pieces(name, (8, 8)) == [None] * tp, name


def test_tp_1_is_the_identity():
    for name in [*SPLIT, *WHOLE]:
        assert Sharding().pieces(name, (3, 5)) == [None]


def test_kv_heads_fewer_than_tp_are_replicated_head_by_head_on_a_gpu_and_refused_on_cpu():
    s = Sharding(4, heads=8, kv_heads=2, device="cuda")  # 2 ranks per K/V head
    k = f"{L}.self_attn.k_proj.weight"
    assert s.pieces(k, (2 * 16, 64)) == [(0, 0, 16), (0, 0, 16), (0, 16, 16), (0, 16, 16)]
    assert Sharding(2, heads=4, kv_heads=2).pieces(k, (32, 64)) == [(0, 0, 16), (0, 16, 16)]  # one head each
    with pytest.raises(Unsupported, match="num_key_value_heads=1 is not a multiple of the engine's tp=2: SGLang's CPU"):
        Sharding(2, heads=4, kv_heads=1)  # a CPU engine pads K/V heads to tp (and the heads with them)


def test_what_labkit_cannot_say_is_refused_naming_the_value():
    with pytest.raises(Unsupported, match="num_attention_heads=5"):
        Sharding(2, heads=5, kv_heads=5)  # Moonlight's preset: SGLang would pad the heads
    with pytest.raises(Unsupported, match="num_key_value_heads=3"):
        Sharding(2, heads=6, kv_heads=3)
    with pytest.raises(Unsupported, match="no rule"):
        Sharding(2, 4, 2).pieces(f"{L}.mlp.experts.0.gate_proj.weight_scale_inv", (4, 4))
    with pytest.raises(Unsupported, match="equal parts"):
        Sharding(2, 4, 2).pieces(f"{L}.mlp.down_proj.weight", (4, 5))
    with pytest.raises(ValueError, match="tp=0"):
        Sharding(0)


def test_mla_has_no_kv_heads_to_split():
    assert Sharding.of_config({"num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 16}, 2).kv_heads \
        is None
    assert Sharding.of_config({"num_attention_heads": 4, "num_key_value_heads": 2}, 2) == Sharding(2, 4, 2, "cpu")


def _model(kv: int = 1):
    g = torch.Generator().manual_seed(kv)
    hd, heads, h, ffn = 4, 4, 8, 40  # ffn 40: a CPU engine at tp 2 pads it to 64, rank 1 holds 8 real rows
    return {
        f"{L}.self_attn.q_proj.weight": torch.randn(heads * hd, h, generator=g),
        f"{L}.self_attn.k_proj.weight": torch.randn(kv * hd, h, generator=g),
        f"{L}.self_attn.v_proj.weight": torch.randn(kv * hd, h, generator=g),
        f"{L}.self_attn.o_proj.weight": torch.randn(h, heads * hd, generator=g),
        f"{L}.mlp.gate_proj.weight": torch.randn(ffn, h, generator=g),
        f"{L}.mlp.up_proj.weight": torch.randn(ffn, h, generator=g),
        f"{L}.mlp.down_proj.weight": torch.randn(h, ffn, generator=g),
        "model.embed_tokens.weight": torch.randn(131, h, generator=g),
        "model.norm.weight": torch.randn(h, generator=g),
    }


def test_padding_is_split_too_so_a_rank_may_hold_mostly_zeros():
    gate = _model()[f"{L}.mlp.gate_proj.weight"]
    r0, r1 = on_ranks(f"{L}.mlp.gate_proj.weight", gate, ffn_pad=64, sharding=Sharding(2, 4, 2))
    assert r0.shape == r1.shape == (32, 8)
    assert torch.equal(r0, gate[:32]) and torch.equal(r1[:8], gate[32:]) and not r1[8:].any()
    table = on_ranks("model.embed_tokens.weight", _model()["model.embed_tokens.weight"], sharding=Sharding(2, 4, 2))
    assert [t.shape[0] for t in table] == [96, 96]  # 131 rows padded to 192 = 3 * 64, split in two


@pytest.mark.parametrize("kv", [1, 2])
def test_the_running_expectation_equals_the_whole_layout_per_rank_in_any_arrival_order(kv):
    named, s = _model(kv), Sharding(2, 4, kv, device="cuda" if kv == 1 else "cpu")
    want = expected_checksums(named, 64, sharding=s)
    assert {k.rsplit("#", 1)[1] for k in want} == {"tp0", "tp1"}
    assert f"{L}.self_attn.qkv_proj.weight#tp1" in want and f"{L}.mlp.gate_up_proj.weight#tp0" in want
    names = list(named)
    random.Random(kv).shuffle(names)  # k before q, up before gate: parts wait for their turn
    e = Expected({f"{L}.self_attn.qkv_proj.weight": 3, f"{L}.mlp.gate_up_proj.weight": 2}, 64, sharding=s)
    for n in names:
        e.add({n: named[n]})
    assert e.finish() == want
    layout = engine_layout(named, 64, s)
    q, k = named[f"{L}.self_attn.q_proj.weight"], named[f"{L}.self_attn.k_proj.weight"]
    qkv1 = layout[f"{L}.self_attn.qkv_proj.weight#tp1"]
    assert torch.equal(qkv1[:8], q[8:]) and torch.equal(qkv1[8:8 + 4], k[4:] if kv == 2 else k)


def test_a_rank_holding_the_other_ranks_piece_fails_verification_naming_it():
    named, s = _model(2), Sharding(2, 4, 2)
    want = expected_checksums(named, 64, sharding=s)
    engine = dict(want)
    o = f"{L}.self_attn.o_proj.weight"
    engine[rank_key(o, 0, 2)], engine[rank_key(o, 1, 2)] = want[rank_key(o, 1, 2)], want[rank_key(o, 0, 2)]
    out = compare(want, engine)
    assert out["sync/verified"] is False and out["verify/mismatched"] == [f"{o}#tp0", f"{o}#tp1"]
    assert compare(want, expected_checksums(named, 64))["sync/verified"] is False  # a tp-1 reading is no match


def _rank(r: int, tp: int = 2, role: str = "target", pp: int = 1) -> dict:
    info = {"role": role, "tp_rank": r, "tp_size": tp, "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": pp}
    return {"checksums": {"w": f"c{r}{role}"}, "per_gpu_checksum": "x", "parallelism_info": [info]}


def test_sglangs_per_rank_reply_is_keyed_by_rank():
    assert rank_checksums([_rank(1), _rank(0)]) == {"w#tp0": "c0target", "w#tp1": "c1target"}
    assert rank_checksums([{"checksums": {"w": "c"}, "parallelism_info": {"role": "target", "tp_rank": 0,
                                                                          "tp_size": 1}}]) == {"w": "c"}
    assert rank_checksums([_rank(0), _rank(1), _rank(0, role="draft"), _rank(1, role="draft")]) == \
        {"w#tp0": "c0target", "w#tp1": "c1target"}
    with pytest.raises(EngineError, match=r"ranks \[0\] of tp=2"):
        rank_checksums([_rank(0)])
    with pytest.raises(Unsupported, match="pp_size=2"):
        rank_checksums([_rank(0, pp=2), _rank(1, pp=2)])
