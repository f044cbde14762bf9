"""labkit.engine.inside.delta, the codec both sides of a delta sync share: property-tested round trips over mixed
dtypes and change fractions, bitwise (NaN, -0.0), the size rule, and a payload whose mask and values disagree."""

import pytest
import torch

from labkit.engine.inside import delta

DTYPES = [torch.bfloat16, torch.float32, torch.float16, torch.int64]


def _flat(ts):
    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in ts])


def _spans(ts):
    out, a = [], 0
    for t in ts:
        out.append((a, a + t.numel() * t.element_size()))
        a = out[-1][1]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_round_trip_is_bitwise_for_any_mix_and_fraction(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 5, (1,), generator=g))
    dtypes = [DTYPES[int(i)] for i in torch.randint(0, len(DTYPES), (n,), generator=g)]
    old = [torch.randn(int(torch.randint(1, 300, (1,), generator=g)), generator=g).to(d) for d in dtypes]
    frac = [0.0, 0.01, 0.2, 1.0][seed % 4]
    new = []
    for t in old:
        c = t.clone()
        hit = torch.rand(t.numel(), generator=g) < frac
        c[hit] = (c[hit].float() + 1).to(t.dtype)
        new.append(c)
    word = delta.word_bytes(t.element_size() for t in new)
    f_new, shadow = _flat(new), _flat(old)
    out = torch.empty(f_new.numel(), dtype=torch.uint8)
    r = delta.encode(f_new, shadow, word, out)
    assert torch.equal(shadow, f_new)  # the trainer's copy follows what it sent
    if r is None:  # not smaller than the bucket: sent whole
        k = int(f_new.view(delta.WORDS[word]).ne(_flat(old).view(delta.WORDS[word])).sum())
        assert min(delta.payload_bytes(f_new.numel() // word, k, word, e) for e in delta.ENCODINGS) >= f_new.numel()
        return
    payload, k, encoding = r
    n = f_new.numel() // word
    assert payload.numel() == min(delta.payload_bytes(n, k, word, e) for e in delta.ENCODINGS)  # the smaller one
    for flat in (False, True):  # per destination (CPU default) and through one scratch bucket (GPU default)
        dst = [t.clone() for t in old]
        assert delta.decode_into(payload, word, n, _spans(old), dst, encoding, flat=flat) == k
        assert torch.equal(_flat(dst), f_new)


@pytest.mark.parametrize("flat", [False, True])
def test_a_runner_holding_some_of_a_bucket_writes_those_and_nothing_else(flat):
    """A speculative engine's draft runner holds a few tensors of a bucket (labkit.engine.draft): it decodes the
    payload into those alone, its spans leaving gaps, and the words of the others land nowhere."""
    g = torch.Generator().manual_seed(0)
    old = [torch.randn(n, generator=g) for n in (40, 24, 64, 8)]
    new = [t.clone() for t in old]
    for t in new:
        t[::5] += 1  # a fifth changed in every tensor, the held ones and the others
    payload, k, encoding = delta.encode(_flat(new), _flat(old), 4, torch.empty(_flat(new).numel(), dtype=torch.uint8))
    held = [1, 3]
    dst = [old[i].clone() for i in held]
    spans = [_spans(old)[i] for i in held]
    assert delta.decode_into(payload, 4, _flat(old).numel() // 4, spans, dst, encoding, flat=flat) == k
    assert all(not torch.equal(d, old[i]) for d, i in zip(dst, held))
    assert all(torch.equal(d, new[i]) for d, i in zip(dst, held))


def test_nan_and_negative_zero_are_compared_as_bits():
    old = torch.tensor([float("nan"), 0.0, 1.0, 2.0] * 8, dtype=torch.float32)
    new = old.clone()
    new[1] = -0.0  # equal as a float, different bits: sent
    shadow, out = _flat([old]), torch.empty(old.numel() * 4, dtype=torch.uint8)
    payload, k, encoding = delta.encode(_flat([new]), shadow, 4, out)
    assert k == 1 and encoding == "index"  # the unchanged NaNs are not "changed" (NaN != NaN as floats)
    dst = [old.clone()]
    delta.decode_into(payload, 4, old.numel(), _spans([old]), dst, encoding)
    assert torch.equal(_flat(dst), _flat([new]))


def test_word_is_the_common_element_size():
    assert delta.word_bytes([2, 2]) == 2 and delta.word_bytes([4, 2]) == 2 and delta.word_bytes([4, 8]) == 4
    assert delta.word_bytes([1, 4]) == 1 and delta.word_bytes([16]) == 8


@pytest.mark.parametrize("changed,encoding", [(1, "index"), (19, "index"), (21, "mask")])
def test_the_smaller_encoding_is_chosen_and_a_short_payload_refused(changed, encoding):
    old = torch.zeros(640, dtype=torch.bfloat16)  # 1/32 of 640 words = 20: above it the mask is smaller
    new = old.clone()
    new[:changed] = 1
    payload, k, enc = delta.encode(_flat([new]), _flat([old]), 2, torch.empty(1280, dtype=torch.uint8))
    assert (k, enc) == (changed, encoding)
    with pytest.raises(ValueError, match="delta decode"):
        delta.decode_into(payload[:-2], 2, 640, _spans([old]), [old.clone()], enc)
    with pytest.raises(ValueError, match="encoding='zip' is invalid"):
        delta.decode_into(payload, 2, 640, _spans([old]), [old.clone()], "zip")


def test_the_delta_bench_summary_compares_medians_of_the_timed_syncs():
    from labkit.lab.bench.delta import _summary

    def m(wall, moving, wire, changed=None, kind=None):
        out = {"bench/wall": wall, "timing/sync/total": moving, "timing/sync/verify": 0.0,
               "timing/sync/session": 0.0, "timing/sync/setup": 0.0, "sync/wire_bytes": wire, "sync/bytes": 1000}
        if changed is not None:
            out.update({"sync/changed_fraction": changed, "sync/delta": kind})
        return out

    arms = {"full": [m(9.0, 9.0, 1000), m(2.0, 1.0, 1000), m(2.2, 1.2, 1000), m(2.1, 1.1, 1000)],
            "delta": [m(5.0, 5.0, 1000, 1.0, "anchor"), m(1.0, 0.5, 200, 0.1, "delta"),
                      m(1.2, 0.6, 300, 0.2, "delta"), m(1.1, 0.55, 250, 0.15, "delta")]}
    s = _summary("colocated", arms)  # the warm-up and the anchor (index 0) are not in the medians
    assert s["bench/delta/wire_ratio/colocated"] == 0.25 and s["bench/delta/changed_fraction/colocated"] == 0.15
    assert s["bench/delta/time_ratio/colocated"] == 0.5 and s["bench/delta/time_ratio_end_to_end/colocated"] == 0.524
    assert s["bench/delta/kinds/colocated"] == ["anchor", "delta", "delta", "delta"]
    assert s["bench/delta/anchor_end_to_end_seconds/colocated"] == 5.0


def test_the_trainer_copy_is_trusted_only_while_nothing_else_changed_the_engine():
    from labkit.sync.delta import DeltaState
    from labkit.sync.plan import TensorMeta, plan_buckets

    plan = plan_buckets([TensorMeta("a", (64,), "bfloat16"), TensorMeta("b", (32,), "bfloat16")], 1 << 20)
    d = DeltaState(anchor_every=3, device="cpu")

    def step(p, engine_version, commit_as):
        d.begin(p, engine_version)
        kind = (d.anchor, d.reason)
        for b in p.buckets:
            d.encode(b, torch.randn(b.nbytes // 2).to(torch.bfloat16).view(torch.uint8), "layout")
        d.commit(commit_as)
        return kind

    assert step(plan, "default", "v1") == (True, "no copy of the engine's weights")
    assert step(plan, "v1", "v2") == (False, "")
    assert step(plan, "v2", "v3") == (False, "")
    assert step(plan, "v3", "v4") == (True, "anchor every 3")  # at least every N syncs
    assert step(plan, "v4", "v5") == (False, "")
    assert step(plan, "v1", "v6")[1] == "engine at 'v1', copy of 'v5'"  # rolled back or restarted behind our back
    new = plan_buckets([TensorMeta("a", (64,), "bfloat16"), TensorMeta("b", (32,), "bfloat16")], 64)
    assert step(new, "v6", "v7")[1] == "new plan"
    d.drop()
    assert step(new, "v7", "v8")[1] == "no copy of the engine's weights"  # a failed or unverified sync
    d.begin(new, "v8")
    assert d.version is None  # mid-sync the copy is ahead of the engine: a failure anywhere leaves it untrusted
    d.commit("v9", apply_path="mixed")  # some tensors went through load_weights, where a delta cannot reach
    assert step(new, "v9", "v10")[1] == "the engine applies some tensors through load_weights"
    assert d.metrics()["sync/delta"] == "anchor" and d.metrics()["sync/wire_bytes"] == 192
