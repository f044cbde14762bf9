"""`labkit bench codec` on the CPU: its keys, its derived break-even link speed, and a check that can fail."""

import pytest

from labkit.engine.inside import delta as codec
from labkit.lab.bench import codec as cb


def test_bench_codec_reports_each_fraction_and_verifies_itself():
    out = cb.bench_codec("cpu", bucket_mb=1, fractions=(0.01, 0.13), reps=1, tensors=4)
    assert out["bench/codec/verified"] is True and out["bench/pack/verified"] is True
    assert out["bench/codec/bucket_bytes"] == 1 << 20
    low, high = "bench/codec/changed_0.01/", "bench/codec/changed_0.13/"
    assert out[low + "encoding"] == "index" and out[high + "encoding"] == "mask"  # the size rule picks each
    assert abs(out[high + "changed_fraction"] - 0.13) < 0.01
    assert out[low + "payload_ratio"] < out[high + "payload_ratio"]
    for p in (low, high):  # the break-even link speed is derived from the same run's numbers
        saved = out["bench/codec/bucket_bytes"] - out[p + "payload_bytes"]
        extra = out[p + "encode_seconds"] + out[p + "decode_seconds"] - out["bench/codec/copy_seconds"]
        if extra > 0:
            assert out[p + "break_even_gbps"] == pytest.approx(saved / extra / 1e9, abs=0.02)
        else:
            assert out[p + "break_even_gbps"] is None
    assert out["bench/pack/tensors"] == (1 << 20) // cb.PACK_TENSOR_BYTES


def test_bench_codec_fails_its_check_when_a_decode_is_wrong(monkeypatch):
    real = codec.decode_into

    def lossy(payload, word, n_words, spans, dsts, encoding="mask"):
        k = real(payload, word, n_words, spans, dsts, encoding)
        dsts[-1].view(-1)[-1:].add_(1)  # one word off
        return k

    monkeypatch.setattr(cb.codec, "decode_into", lossy)
    out = cb.bench_codec("cpu", bucket_mb=0.25, fractions=(0.05,), reps=1, tensors=2)
    assert out["bench/codec/verified"] is False and out["bench/codec/changed_0.05/verified"] is False


@pytest.mark.parametrize("kw, word", [({"device": "tpu"}, "device='tpu'"), ({"fractions": (1.5,)}, "fractions"),
                                      ({"reps": 0}, "reps=0")])
def test_bench_codec_refuses_bad_input_naming_it(kw, word):
    with pytest.raises(ValueError, match=word):
        cb.bench_codec(**{"bucket_mb": 0.25, **kw})
