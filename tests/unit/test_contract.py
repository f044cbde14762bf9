"""The engine contract (labkit.engine.contract): the fused-group table, the one pre-send check, and that plan,
verify and the MiMo model code all read the same table."""

import json
import random

import pytest
import torch

from labkit.engine import EngineError
from labkit.engine.backend import EngineBackend
from labkit.engine.contract import CAP, FUSED, Contract, ContractMismatch, check_tensors, fused_group, fused_part
from labkit.engine.http import HttpBackend
from labkit.models.tiny import make_tiny_mimo
from labkit.sync import engine_spec
from labkit.sync.plan import TensorMeta, check_coverage, plan_buckets
from labkit.sync.verify import Expected, engine_layout, expected_checksums

PREFIXES = ["model.layers.0.self_attn", "model.layers.11.mlp", "model.mtp_layers.0.self_attn", "x"]


def test_every_fused_group_has_shard_indices_0_to_n_minus_1():
    groups: dict[str, list] = {}
    for r in FUSED:
        groups.setdefault(r.fused, []).append(r)
    assert set(groups) == {"qkv_proj", "gate_up_proj", "fused_qkv_a_proj_with_mqa"}
    for fused, rules in groups.items():
        sizes = {r.size for r in rules}
        assert len(sizes) == 1 and sorted(r.index for r in rules) == list(range(sizes.pop())), fused
        assert len({r.part for r in rules}) == len(rules)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("kind", ["weight", "bias"])
def test_every_fused_part_maps_to_its_group(prefix, kind):
    for r in FUSED:
        key, index, size = fused_part(f"{prefix}.{r.part}.{kind}")
        assert (key, index, size) == (f"{prefix}.{r.fused}.{kind}", r.index, r.size)
        assert fused_group(f"{prefix}.{r.part}.{kind}") == key


@pytest.mark.parametrize("name", [
    "model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.self_attn.q_proj.weight_scale",
    "q_proj.weight", "model.layers.0.self_attn.q_proj", "model.mtp_layers.0.input_proj.weight"])
def test_fused_group_is_the_identity_on_names_that_are_not_fused_parts(name):
    assert fused_part(name) is None and fused_group(name) == name
    assert fused_group(fused_group(name)) == fused_group(name)


def test_fused_group_is_idempotent_on_random_names():
    rng = random.Random(0)
    parts = [r.part for r in FUSED] + ["o_proj", "down_proj", "qkv_proj", "gate_up_proj", "norm", "experts.3"]
    for _ in range(500):
        name = ".".join(rng.choice(parts + ["model", "layers", "7"]) for _ in range(rng.randint(1, 5)))
        name += rng.choice([".weight", ".bias", "", ".weight_scale"])
        assert fused_group(fused_group(name)) == fused_group(name), name


def _meta(n, i):
    return TensorMeta(f"model.layers.{i}.{n}.weight", (8, 8), "float32")


@pytest.mark.parametrize("bucket_bytes", [1, 200, 256, 600, 1024, 4096])
def test_a_plan_never_splits_a_fused_group(bucket_bytes):
    metas = [_meta(f"self_attn.{p}", i) for i in range(3) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    metas += [_meta(f"mlp.{p}", i) for i in range(3) for p in ("gate_proj", "up_proj", "down_proj")]
    plan = plan_buckets(metas, bucket_bytes)
    where = {n: b.index for b in plan.buckets for n in b.names}
    for m in metas:
        assert len({where[x.name] for x in metas if fused_group(x.name) == fused_group(m.name)}) == 1


def test_verify_layout_follows_the_table():
    named = {f"l.{r.part}.weight": torch.full((r.index + 1, 2), float(r.index)) for r in FUSED}
    layout = engine_layout(named)
    assert sorted(layout) == ["l.fused_qkv_a_proj_with_mqa.weight", "l.gate_up_proj.weight", "l.qkv_proj.weight"]
    assert layout["l.qkv_proj.weight"][:, 0].tolist() == [0, 1, 1, 2, 2, 2]
    acc = Expected()
    for name in reversed(list(named)):  # one tensor at a time, in any order: hashed once complete
        acc.add({name: named[name]})
    assert acc.finish() == expected_checksums(named)


def test_the_one_check_names_every_bad_tensor_up_to_the_cap():
    expected = {f"t{i}": ((2, 2), "float32") for i in range(30)}
    check_tensors(expected, [("t0", (2, 2), "float32"), ("t1", [2, 2])], "sync plan")
    check_tensors(None, [("anything", (1,))], "sync plan")
    bad = [(f"t{i}", (3,), "float32") for i in range(CAP)] + [("nope", (1,)), ("t29", (2, 2), "bfloat16")]
    with pytest.raises(ContractMismatch) as err:
        check_tensors(expected, bad, "update_weights_from_tensor")
    msg = str(err.value)
    assert msg.startswith("update_weights_from_tensor does not match the engine's model, refused before sending")
    assert all(f"'t{i}': shape (3,) != engine (2, 2)" in msg for i in range(CAP))
    assert "nope" not in msg and msg.endswith("(+2 more)")
    assert isinstance(err.value, EngineError) and isinstance(err.value, ValueError)
    with pytest.raises(ContractMismatch, match=r"'nope': not a weight.*'t29': dtype bfloat16 != engine float32$"):
        check_tensors(expected, bad[CAP:], "sync plan")
    with pytest.raises(ContractMismatch, match=r"^sync plan does not match.*3: a tensor name must be a string"):
        check_tensors(expected, [(3, (1,))], "sync plan")


def test_the_sync_plan_uses_the_one_check():
    plan = plan_buckets([TensorMeta("w", (4, 4), "float32")], 1 << 20)
    with pytest.raises(ContractMismatch, match="^sync plan does not match the engine's model.*'w': shape"):
        check_coverage(plan, {"w": ((4, 5), "float32")})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_mimo(tmp_path_factory.mktemp("tiny")))


def test_the_kept_contract_follows_a_rewritten_checkpoint(tmp_path):
    """engine_spec is read from a cache (every sync asks): a checkpoint written again with other shapes is read
    again, not answered from the old headers."""
    small = make_tiny_mimo(tmp_path / "m")
    before = engine_spec(str(small))
    import safetensors.torch as st
    f = next(small.glob("*.safetensors"))
    tensors = st.load_file(str(f))
    name = next(iter(tensors))
    tensors[name] = torch.zeros(3, 5)
    st.save_file(tensors, str(f))
    after = engine_spec(str(small))
    assert before["tensors"][name][0] != (3, 5) and after["tensors"][name][0] == (3, 5)


def test_contract_from_model_dir_is_what_engine_spec_returns(model_dir):
    c = Contract.from_model_dir(model_dir)
    assert c.dtype == json.load(open(f"{model_dir}/config.json")).get("torch_dtype", "bfloat16")
    assert engine_spec(model_dir) == {"tensors": c.tensors, "dtype": c.dtype, "ffn_pad": 1, "quant": None}
    assert engine_spec(model_dir, ffn_pad=32)["ffn_pad"] == 32
    f32 = Contract.from_model_dir(model_dir, "float32")
    assert set(f32.tensors) == set(c.tensors) and {d for _, d in f32.tensors.values()} == {"float32"}
    assert Contract.find(model_dir) == c and Contract.find(model_dir) is Contract.find(model_dir)
    assert Contract.find("<remote>") is None
    assert Contract.find(model_dir, "float16").dtype == "float16" and engine_spec(model_dir, "float16")["dtype"] == \
        "float16"
    # every fused part of the real checkpoint names a group whose parts are all there
    groups: dict[str, set] = {}
    for n in c.tensors:
        if (part := fused_part(n)) is not None:
            groups.setdefault(part[0], set()).add((part[1], part[2]))
    assert groups and all(sorted(i for i, _ in v) == list(range(next(iter(v))[1])) for v in groups.values())


def test_both_backends_provide_the_engine_backend_protocol():
    assert isinstance(HttpBackend("http://127.0.0.1:1", 1.0), EngineBackend)
    assert not isinstance(object(), EngineBackend)


@pytest.mark.parametrize("seed", range(5))
def test_engine_rows_pad_vocab_tables_like_sglang(seed):
    from sglang.srt.layers.vocab_parallel_embedding import pad_vocab_size

    from labkit.engine.contract import engine_rows

    rng = random.Random(seed)
    for _ in range(50):
        rows = rng.randint(1, 5000)
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            assert engine_rows(name, rows) == pad_vocab_size(rows, 64)  # SGLang's own rule at TP=1
            got = engine_rows(name, rows, tp=3)
            assert got >= rows and got % 3 == 0 and got - rows < 64 * 3
        assert engine_rows("model.layers.0.mlp.down_proj.weight", rows) == rows  # nothing else is padded


def test_an_odd_vocabulary_hashes_like_the_engines_zero_padded_table():
    from labkit.sync import verify as vf

    t = torch.randn(131, 8)
    engine_table = torch.cat([t, torch.zeros(61, 8)])  # SGLang's 192 rows, padding zero-filled at load
    want = vf.tensor_checksum(engine_table)
    assert vf.expected_checksums({"model.embed_tokens.weight": t})["model.embed_tokens.weight"] == want
    e = vf.Expected()
    e.add({"lm_head.weight": t})
    assert e.finish()["lm_head.weight"] == vf.tensor_checksum(engine_table)
    dirty = engine_table.clone()
    dirty[150, 0] = 1.0  # a non-zero padding row is caught
    assert vf.tensor_checksum(dirty) != want
    assert vf.padded("model.norm.weight", torch.ones(8)).shape == (8,)
