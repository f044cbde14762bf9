import random

import pytest

from labkit.sync.plan import ITEMSIZE, TensorMeta, check_coverage, fused_group, plan_buckets


def _random_model(rng: random.Random, n_layers: int) -> list[TensorMeta]:
    out = [TensorMeta("model.embed_tokens.weight", (rng.randint(1, 300), 8), "float32")]
    for i in range(n_layers):
        p = f"model.layers.{i}"
        dt = rng.choice(["float32", "bfloat16", "float16", "int8"])
        for part in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            out.append(TensorMeta(f"{p}.{part}.weight", (rng.randint(1, 64), rng.randint(1, 33)), dt))
        out.append(TensorMeta(f"{p}.self_attn.q_proj.bias", (rng.randint(1, 9),), "bfloat16"))
        out.append(TensorMeta(f"{p}.input_layernorm.weight", (rng.randint(1, 17),), "float32"))
    return out


@pytest.mark.parametrize("seed", range(30))
def test_every_byte_lands_exactly_once_groups_never_split_oversize_alone(seed):
    rng = random.Random(seed)
    metas = _random_model(rng, rng.randint(1, 6))
    dup = rng.choice(metas)
    plan = plan_buckets(metas + [dup], bucket_bytes=rng.choice([1, 64, 500, 4096, 10**6]))
    names = [t.name for t in plan.tensors]
    assert sorted(names) == sorted({m.name for m in metas})          # each tensor exactly once
    assert plan.dropped == (dup.name,)
    assert plan.total_bytes == sum(m.nbytes for m in metas)           # every byte
    where = {t.name: b.index for b in plan.buckets for t in b.tensors}
    for m in metas:                                                   # fused groups never split
        assert where[m.name] == where[next(x.name for x in metas if fused_group(x.name) == fused_group(m.name))]
    for b in plan.buckets:
        if b.nbytes > plan.bucket_bytes:                              # oversize only alone (one group)
            assert b.oversize and len({fused_group(n) for n in b.names}) == 1
        offset = 0                                                    # every offset aligned for its dtype
        for t in b.tensors:
            assert offset % ITEMSIZE[t.dtype] == 0
            offset += t.nbytes
    largest_group = max(b.nbytes for b in plan.buckets if b.oversize) if any(b.oversize for b in plan.buckets) else 0
    assert plan.peak_extra_bytes <= 2 * plan.bucket_bytes + largest_group     # the memory contract


@pytest.mark.parametrize("bad", [0, -5, "64", 1.5, None, True])
def test_bad_bucket_size_is_named(bad):
    with pytest.raises(ValueError, match=r"bucket_bytes="):
        plan_buckets([TensorMeta("a", (2,), "float32")], bad)


def test_bucket_over_budget_is_refused():
    with pytest.raises(ValueError, match="over the memory budget"):
        plan_buckets([TensorMeta("a", (2,), "float32")], 1 << 20, budget_bytes=1 << 20)


def test_plan_is_replayable_and_validated_against_engine():
    metas = [TensorMeta("w", (4, 4), "float32"), TensorMeta("b", (4,), "bfloat16")]
    a, b = plan_buckets(metas, 64), plan_buckets(metas, 64)
    assert a == b
    check_coverage(a, {"w": ((4, 4), "float32"), "b": ((4,), "bfloat16")})
    with pytest.raises(ValueError, match=r"'w': shape \(4, 4\) != engine \(4, 5\)"):
        check_coverage(a, {"w": ((4, 5), "float32"), "b": ((4,), "bfloat16")})
    with pytest.raises(ValueError, match="'b': not a weight"):
        check_coverage(a, {"w": ((4, 4), "float32")})
    with pytest.raises(ValueError, match="dtype 'float33'|dtype='float33'"):
        TensorMeta("x", (1,), "float33")
