"""The behaviour probe's arithmetic (labkit.sync.probe) on a small torch model standing in for both sides: the
k3 estimate is 0 when engine and trainer compute the same distribution, grows with the gap, is never negative,
and a gap over the threshold fails with the numbers named. The real probe (a Megatron trainer against an SGLang
engine, bf16 and FP8) is tests/integration/test_fp8.py."""

import pytest
import torch

from labkit.sync import probe

VOCAB = 32


class Scorer:
    """`forward(ids) -> {"logits"}` of a fixed random bigram table, shifted by `bias` (a second model)."""

    def __init__(self, bias: float = 0.0):
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(VOCAB, VOCAB + 3, generator=g) * 2  # 3 padded vocabulary columns
        self.table[:, :VOCAB] += bias * torch.randn(VOCAB, VOCAB, generator=g)

    def forward(self, ids):
        return {"logits": self.table[ids[0]][None]}


class Sampler:
    """An engine's `generate(input_ids, return_logprob, sampling)`: samples from a Scorer's distribution."""

    def __init__(self, model: Scorer):
        self.model = model

    def generate(self, input_ids, return_logprob, sampling):
        g = torch.Generator().manual_seed(sampling["sampling_seed"])
        outs = []
        for ids in input_ids:
            seq, new, lps = list(ids), [], []
            for _ in range(sampling["max_new_tokens"]):
                lp = torch.log_softmax(self.model.table[seq[-1], :VOCAB].double(), -1)
                t = int(torch.multinomial(lp.exp(), 1, generator=g))
                new.append(t)
                lps.append(float(lp[t]))
                seq.append(t)
            outs.append({"tokens": new, "logprobs": lps})
        return outs


def test_the_same_model_on_both_sides_shows_no_gap_and_a_different_one_is_caught():
    same = probe.measure(Scorer(), Sampler(Scorer()), tokens=6, vocab=VOCAB)
    assert same["sync/probe_tokens"] == probe.PROMPTS * 6
    assert same["sync/probe_kl"] < 1e-12 and same["sync/probe_max_abs_logprob_diff"] < 1e-9
    assert probe.verdict(same, 0.02) is None
    gaps = [probe.measure(Scorer(b), Sampler(Scorer()), tokens=6, vocab=VOCAB)["sync/probe_kl"] for b in (0.1, 1.0)]
    assert 0 < gaps[0] < gaps[1]
    bad = probe.measure(Scorer(1.0), Sampler(Scorer()), tokens=6, vocab=VOCAB)
    assert "sync/probe_kl=" in probe.verdict(bad, 0.02) and probe.verdict(bad, 1e9) is None
    assert probe.verdict({**bad, "sync/probe_kl": float("nan")}, 1e9) is not None


def test_the_probe_batch_is_fixed_and_a_producer_that_cannot_score_is_named():
    assert probe.prompts(VOCAB) == probe.prompts(VOCAB) and max(max(p) for p in probe.prompts(VOCAB)) < VOCAB
    with pytest.raises(ValueError, match="cannot score tokens"):
        probe.measure(object(), Sampler(Scorer()), tokens=2, vocab=VOCAB)


def test_stream_refuses_a_probe_before_anything_moves():
    from labkit.sync import SyncConfig, stream

    with pytest.raises(ValueError, match="stream\\(\\): SyncConfig.probe=4"):
        stream([], None, SyncConfig(probe=4))


def test_the_default_limit_follows_the_engines_precision_and_a_given_one_wins():
    assert probe.limit(None, {"dtype": "float32", "quant": None}) == probe.LIMITS["float32"] == 1e-4
    assert probe.limit(None, {"dtype": "bfloat16", "quant": {"block": (128, 128)}}) == probe.LIMITS["other"]
    assert probe.limit(None, {"dtype": "float32", "quant": {"block": (128, 128)}}) == probe.LIMITS["other"]
    assert probe.limit(0.5, {"dtype": "float32"}) == 0.5
