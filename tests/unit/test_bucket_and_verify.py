import pytest
import torch

from labkit.sync import bucket as bk
from labkit.sync.plan import TensorMeta, plan_buckets
from labkit.sync.verify import Expected, compare, engine_layout, expected_checksums, tensor_checksum


def _named():
    g = torch.Generator().manual_seed(0)
    return {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 4, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(4, 4, generator=g),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(4, 4, generator=g),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(8, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(3, generator=g).to(torch.float16),
        "lm_head.weight": torch.randn(5, 4, generator=g).to(torch.bfloat16),
    }


def _metas(named):
    return [TensorMeta(n, tuple(t.shape), bk.dtype_name(t.dtype)) for n, t in named.items()]


def test_pack_round_trips_through_sglangs_own_flattened_bucket():
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    named = _named()
    plan = plan_buckets(_metas(named), bucket_bytes=1 << 20)
    (b,) = plan.buckets
    pool = bk.BufferPool(plan.largest_bucket_bytes)
    flat = bk.pack(b, named, pool.take())
    theirs = FlattenedTensorBucket(flattened_tensor=flat, metadata=bk.metadata(b)).reconstruct_tensors()
    assert [n for n, _ in theirs] == b.names
    for name, t in theirs:
        assert t.dtype == named[name].dtype and torch.equal(t, named[name])
    # And SGLang's own packing of the same tensors in the same order gives the same bytes.
    ref = FlattenedTensorBucket(named_tensors=[(n, named[n]) for n in b.names])
    assert torch.equal(ref.get_flattened_tensor(), flat)
    # The receive side of the distributed transport accepts the layout (alignment checked there).
    FlattenedTensorBucket.empty(b.names, [named[n].dtype for n in b.names], [named[n].shape for n in b.names], "cpu")
    assert [n for n, _ in bk.unpack(b, flat)] == b.names


def _reference_pack(b, named) -> bytes:
    return b"".join(named[m.name].to(bk.torch_dtype(m.dtype)).contiguous().view(-1).view(torch.uint8).numpy()
                    .tobytes() for m in b.tensors)


@pytest.mark.parametrize("start", [0, 1])  # 1: every typed view of the buffer is misaligned (per-tensor copies)
def test_pack_casts_and_copies_misaligned_runs_byte_for_byte(start):
    """Runs of one dtype (the plan orders by dtype) go through one torch.cat into a typed view; a buffer
    starting at an odd byte cannot be viewed as fp32 and is copied tensor by tensor; a planned bf16 casts an
    fp32 export; transposed (non-contiguous) exports are laid out in C order."""
    g = torch.Generator().manual_seed(1)
    named = {"a.weight": torch.randn(3, 5, generator=g), "b.weight": torch.randn(7, generator=g).t(),
             "mask": torch.tensor([True, False, True]), "c.weight": torch.randn(4, 3, generator=g).t(),
             "d.weight": torch.randn(6, generator=g), "e.weight": torch.randn(2, 2, generator=g)}
    metas = _metas(named)
    metas[4] = TensorMeta("d.weight", (6,), "bfloat16")  # the engine serves bf16: the pack casts
    (b,) = plan_buckets(metas, 1 << 20).buckets
    out = torch.full((b.nbytes + 2,), 7, dtype=torch.uint8)
    flat = bk.pack(b, named, out[start:])
    assert bytes(flat.numpy()) == _reference_pack(b, named)
    assert out[start + b.nbytes] == 7  # nothing past the bucket


def test_a_run_of_many_small_tensors_packs_byte_for_byte():
    """An MoE-like bucket: hundreds of small expert tensors, two dtypes (one `torch.cat` per run)."""
    g = torch.Generator().manual_seed(2)
    named = {f"model.layers.0.mlp.experts.{e}.{k}.weight": torch.randn(5 + e % 3, 7, generator=g)
             for e in range(100) for k in ("gate_proj", "up_proj", "down_proj")}
    named.update({f"x.{i}": torch.randn(3, generator=g).to(torch.bfloat16) for i in range(70)})
    (b,) = plan_buckets(_metas(named), 1 << 22).buckets
    out = torch.full((b.nbytes + 1,), 7, dtype=torch.uint8)
    flat = bk.pack(b, named, out)
    assert bytes(flat.numpy()) == _reference_pack(b, named) and out[b.nbytes] == 7


def test_a_cpu_sync_streams_on_every_core_but_the_engines_and_gives_the_threads_back(monkeypatch):
    """The trainer leaves the engine's apply a core while the buckets stream (bucket.host_threads), and gets its
    own threads back afterwards, also when the sync fails."""
    before = torch.get_num_threads()
    monkeypatch.setattr(bk.os, "cpu_count", lambda: 8)
    torch.set_num_threads(8)
    try:
        with bk.host_threads("cpu") as n:
            assert n == 7 and torch.get_num_threads() == 7
        with bk.host_threads("cpu", 3) as n:  # SyncConfig.host_threads
            assert n == 3 and torch.get_num_threads() == 3
        with bk.host_threads("cuda", 3) as n:  # copies on the device: the host's threads are left alone
            assert n == 8 and torch.get_num_threads() == 8
        with bk.host_threads("cpu", cross_node=True) as n:  # an engine on another node has cores of its own
            assert n == 8 and torch.get_num_threads() == 8
        monkeypatch.setattr(bk.os, "cpu_count", lambda: 1)
        with pytest.raises(RuntimeError, match="boom"), bk.host_threads("cpu") as n:
            assert n == 1 and torch.get_num_threads() == 1
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 8
    finally:
        torch.set_num_threads(before)


def test_pack_refuses_wrong_shape_and_small_buffer():
    named = _named()
    (b,) = plan_buckets(_metas(named), 1 << 20).buckets
    with pytest.raises(ValueError, match="cannot hold"):
        bk.pack(b, named, torch.empty(4, dtype=torch.uint8))
    named["lm_head.weight"] = torch.zeros(6, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"lm_head.weight: shape \(6, 4\)"):
        bk.pack(b, named, torch.empty(b.nbytes, dtype=torch.uint8))


def test_checksums_match_sglang_hash_and_fused_layout():
    from sglang.srt.managers.mm_utils import tensor_hash

    named = _named()
    t = named["lm_head.weight"]
    assert tensor_checksum(t, "sha256") == f"{tensor_hash(t):016x}"  # an engine without labkit's models
    layout = engine_layout(named)
    qkv = layout["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (16, 4) and torch.equal(qkv[8:12], named["model.layers.0.self_attn.k_proj.weight"])
    exp = expected_checksums(named)
    assert compare(exp, dict(exp))["sync/verified"]
    bad = dict(exp, **{"model.norm.weight": "0" * 16})
    r = compare(exp, bad)
    assert not r["sync/verified"] and r["verify/mismatched"] == ["model.norm.weight"]


def test_xxh3_checksum_is_streaming_bitwise_and_refuses_unknown_algorithms():
    import xxhash

    from labkit.engine import checksum as ck

    t = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    assert tensor_checksum(t) == f"xxh3:{xxhash.xxh3_64(t.numpy().tobytes()).intdigest():016x}"
    h = ck.new()  # fed in parts = one tensor of the parts' bytes (how a fused group is hashed)
    ck.feed(h, t[:2])
    ck.feed(h, t[2:])
    assert ck.digest(h) == tensor_checksum(t)
    flipped = t.clone()
    flipped.view(torch.int32)[5, 3] ^= 1  # one bit of one element
    assert tensor_checksum(flipped) != tensor_checksum(t)
    assert tensor_checksum(t.t()) != tensor_checksum(t)  # layout, not only the multiset of values
    with pytest.raises(ValueError, match=r"checksum algorithm 'md5' is not one of"):
        Expected(algo="md5")


def test_expected_checksums_accumulate_fused_groups_across_per_tensor_buckets():
    named = _named()
    for algo in ("xxh3_64", "sha256"):
        acc = Expected(algo=algo)
        for name, t in named.items():  # one tensor at a time, as the per-tensor transport sends them
            acc.add({name: t})
        assert acc.finish() == expected_checksums(named, algo=algo)
    partial = Expected()
    partial.add({"model.layers.0.self_attn.q_proj.weight": named["model.layers.0.self_attn.q_proj.weight"]})
    got = partial.finish()
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert got[qkv] != expected_checksums(named)[qkv]
