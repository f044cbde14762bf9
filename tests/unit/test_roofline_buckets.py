"""The roofline's bucket counts are the planner's (labkit.sync.plan.plan_buckets), on random tensor lists."""

import random

import pytest

from labkit.engine.contract import plan_group
from labkit.lab.roofline import bounds as rf
from labkit.lab.roofline.tensors import ModelTensors, largest_group_bytes, model_tensors
from labkit.sync.plan import ITEMSIZE, TensorMeta, plan_buckets

SMALL_MLA = {"model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
             "moe_intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2, "q_lora_rank": 8,
             "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "n_routed_experts": 3,
             "n_shared_experts": 1, "first_k_dense_replace": 1, "topk_method": "noaux_tc",
             "num_nextn_predict_layers": 1}


def _random_tensors(rng: random.Random) -> list[TensorMeta]:
    """A draw of a DeepSeek (MLA pairs, experts, FP8 scales) and a MiMo model's names (q/k/v and gate/up groups
    split or whole), a few of them twice, with random shapes (empty ones too) and dtypes."""
    pool = [t.name for t in (*model_tensors(SMALL_MLA, "fp8").tensors, *model_tensors("tiny").tensors)]
    names = rng.sample(pool, rng.randint(0, 80)) + rng.choices(pool, k=rng.randint(0, 5))
    return [TensorMeta(n, tuple(rng.randint(0, 300) for _ in range(rng.randint(1, 2))), rng.choice(sorted(ITEMSIZE)))
            for n in names]


@pytest.mark.parametrize("seed", range(40))
def test_bucket_count_is_the_planners_on_random_lists(seed):
    rng = random.Random(seed)
    ts = _random_tensors(rng)
    mt = ModelTensors("random", "deepseek_v3", "bf16", 0, tuple(ts))
    total = sum(t.nbytes for t in ts)
    for size in (1, rng.randint(1, 4096), rng.randint(1, 1 << 20), max(1, total // 3), total + 1):
        want = len(plan_buckets(ts, size).buckets)
        assert rf.count_buckets(ts, size) == mt.buckets(size) == want
        assert mt.buckets(size) == want  # asked again: the count planned once


@pytest.mark.parametrize("seed", range(20))
def test_largest_group_is_summed_from_the_planners_groups(seed):
    ts = _random_tensors(random.Random(seed))
    groups: dict[str, int] = {}
    for t in {t.name: t for t in reversed(ts)}.values():  # the first of each name, as the planner keeps it
        groups[plan_group(t.name)] = groups.get(plan_group(t.name), 0) + t.nbytes
    assert largest_group_bytes(ts) == max(groups.values(), default=0)


def test_bad_bucket_sizes_are_refused_before_any_cached_count():
    mt = model_tensors("tiny")
    # q/k/v weights, q/k/v biases and gate/up are one group each: 5 buckets fewer per layer (2 + the MTP layer)
    assert mt.buckets(1) == mt.num_tensors - 5 * 3
    for bad in (0, -1, True, 1.0):
        with pytest.raises(ValueError, match=rf"^bucket_bytes={bad!r} is invalid"):
            mt.buckets(bad)
