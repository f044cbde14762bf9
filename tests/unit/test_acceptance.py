import math

import pytest
import torch

from labkit.mtp.acceptance import (
    Counters,
    expected_accept_length,
    from_counters,
    offline_accept_rate,
    parse_sglang_meta,
    rate_from_length,
)


def test_from_counters_follows_sglang_definitions():
    out = from_counters(4, 10, 5, 2, per_position=[(3, 4), (2, 3)])
    assert list(out) == ["mtp/accept_length", "mtp/accept_rate", "mtp/accept_rate_pos_1", "mtp/accept_rate_pos_2",
                         "mtp/verify_ct"]
    assert out["mtp/accept_length"] == 10 / 4  # bonus token included
    assert out["mtp/accept_rate"] == 5 / (4 * 2)  # strict: drafts only
    assert out["mtp/accept_rate_pos_1"] == 3 / 4 and out["mtp/accept_rate_pos_2"] == 2 / 3
    assert out["mtp/verify_ct"] == 4
    assert set(from_counters(4, 10, 5, 2)) == {"mtp/accept_length", "mtp/accept_rate", "mtp/verify_ct"}
    nothing = from_counters(0, 1, 0, 2, per_position=[(0, 0), (0, 0)])
    assert math.isnan(nothing["mtp/accept_length"]) and math.isnan(nothing["mtp/accept_rate_pos_1"])


def test_counters_sum_across_requests_not_average_ratios():
    a = Counters(k=2, verify_ct=1, completion_tokens=3, correct_drafts=2, pos_accepted=(1, 1), pos_proposed=(1, 1))
    b = Counters(k=2, verify_ct=3, completion_tokens=4, correct_drafts=0, pos_accepted=(0, 0), pos_proposed=(3, 0))
    total = Counters.total([a, b], k=2)
    assert total == Counters(k=2, verify_ct=4, completion_tokens=7, correct_drafts=2, pos_accepted=(1, 1),
                             pos_proposed=(4, 1))
    assert total.metrics()["mtp/accept_length"] == 7 / 4  # not mean(3/1, 4/3)
    assert a.merge(Counters(k=2, verify_ct=1, completion_tokens=1)).pos_proposed == ()  # unknown stays unknown
    with pytest.raises(ValueError, match=r"^k=3 is invalid"):
        a.merge(Counters(k=3))


@pytest.mark.parametrize("args,name", [
    ((1, 2, 3, 1), "correct_drafts"), ((2, 1, 0, 1), "completion_tokens"), ((-1, 0, 0, 1), "verify_ct"),
    ((1, 1, 0, 0), "draft_len"), ((1, 1.5, 0, 1), "completion_tokens"),
])
def test_from_counters_rejects_impossible_counts_naming_them(args, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        from_counters(*args)


def test_from_counters_rejects_bad_per_position():
    with pytest.raises(ValueError, match=r"^per_position=.*2 \(accepted, proposed\) pairs"):
        from_counters(2, 4, 1, 2, per_position=[(1, 2)])
    with pytest.raises(ValueError, match=r"^accepted_pos_2=3 is invalid: expected at most proposed_pos_2 = 1"):
        from_counters(2, 4, 1, 2, per_position=[(1, 2), (3, 1)])


def test_expected_accept_length_and_its_inverse():
    assert expected_accept_length(0, 3) == 1
    assert expected_accept_length(1, 3) == 4
    assert expected_accept_length(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    for k in (1, 2, 5):
        for a in (0.0, 0.1, 0.44, 0.54, 0.9, 0.999, 1.0):
            assert expected_accept_length(a, k) == pytest.approx(sum(a ** j for j in range(k + 1)))
            assert rate_from_length(expected_accept_length(a, k), k) == pytest.approx(a, abs=1e-9)


@pytest.mark.parametrize("call,match", [
    (lambda: expected_accept_length(1.5, 2), r"^a=1\.5 is invalid: expected a number in \[0, 1\]"),
    (lambda: expected_accept_length(-0.1, 2), r"^a=-0\.1 is invalid"),
    (lambda: expected_accept_length(0.5, 0), r"^k=0 is invalid: expected an integer >= 1"),
    (lambda: rate_from_length(0.5, 2), r"^length=0\.5 is invalid: expected a number in \[1, k \+ 1 = 3\]"),
    (lambda: rate_from_length(3.5, 2), r"^length=3\.5 is invalid"),
    (lambda: rate_from_length(2, 0), r"^k=0 is invalid"),
])
def test_theory_rejects_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _log(*probs):
    return torch.tensor(probs).log()


def _case():
    """V=2, s=4: positions i=0,1 draft tokens 2,3. q_i = softmax(mtp[:, i]), p_i = softmax(logits[:, i+1])."""
    logits, mtp = torch.zeros(1, 4, 2), torch.zeros(1, 4, 2)
    logits[0, 1], mtp[0, 0] = _log(0.75, 0.25), _log(0.4, 0.6)  # overlap 0.4 + 0.25 = 0.65; argmax differ
    logits[0, 2], mtp[0, 1] = _log(0.1, 0.9), _log(0.3, 0.7)  # overlap 0.1 + 0.7 = 0.8; argmax agree
    return logits, mtp


def test_offline_accept_rate_hand_computed():
    logits, mtp = _case()
    both, last = torch.tensor([[0, 0, 1, 1]]), torch.tensor([[0, 0, 0, 1]])
    rate, n = offline_accept_rate(logits, mtp, both, 1.0)
    assert (rate, n) == (pytest.approx((0.65 + 0.8) / 2), 2)
    assert offline_accept_rate(logits, mtp, last, 1.0) == (pytest.approx(0.8), 1)
    assert offline_accept_rate(logits, mtp, both, 0) == (0.5, 2)  # indicator argmax p == argmax q
    # T = 2 flattens both: p_0 ~ sqrt(0.75, 0.25), q_0 ~ sqrt(0.4, 0.6)
    p0 = torch.tensor([0.75, 0.25]).sqrt() / torch.tensor([0.75, 0.25]).sqrt().sum()
    q0 = torch.tensor([0.4, 0.6]).sqrt() / torch.tensor([0.4, 0.6]).sqrt().sum()
    rate, _ = offline_accept_rate(logits, mtp, torch.tensor([[0, 0, 1, 0]]), 2.0)
    assert rate == pytest.approx(float(torch.minimum(p0, q0).sum()))
    assert offline_accept_rate(logits, mtp, torch.zeros(1, 4), 1.0)[1] == 0
    assert math.isnan(offline_accept_rate(logits[:, :2], mtp[:, :2], both[:, :2], 1.0)[0])



def test_offline_accept_rate_rejects_bad_inputs():
    logits, mtp = _case()
    mask = torch.ones(1, 4)
    with pytest.raises(ValueError, match=r"^temperature=-1 is invalid: expected a number >= 0"):
        offline_accept_rate(logits, mtp, mask, -1)
    with pytest.raises(ValueError, match=r"^mtp_logits.shape=\(1, 3, 2\) is invalid"):
        offline_accept_rate(logits, mtp[:, :3], mask, 1.0)
    with pytest.raises(ValueError, match=r"^mask.shape=\(1, 3\) is invalid"):
        offline_accept_rate(logits, mtp, mask[:, :3], 1.0)


# Per-request meta_info as SGLang's TokenizerManager writes it (k = speculative_num_steps = 2).
META = [
    {"completion_tokens": 10, "spec_verify_ct": 4, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 8,
     "spec_accept_rate": 5 / 8, "spec_accept_length": 10 / 4, "spec_correct_drafts_histogram": [1, 1, 2]},
    {"completion_tokens": 1},  # finished at prefill: SGLang writes no spec_* keys
    {"completion_tokens": 6, "spec_verify_ct": 2, "spec_accept_rate": 0.75, "spec_correct_drafts_histogram": [0, 1, 1]},
]


def test_parse_sglang_meta_sums_counters_and_reads_the_histogram():
    out = parse_sglang_meta(META, 2)
    # histograms -> (accepted, proposed): [1, 1, 2] -> (3, 4), (2, 3); [0, 1, 1] -> (2, 2), (1, 2)
    assert out == from_counters(6, 17, 8, 2, per_position=[(5, 6), (3, 5)])
    assert parse_sglang_meta(META[:1], 2)["mtp/accept_length"] == META[0]["spec_accept_length"]
    no_hist = [{k: v for k, v in m.items() if k != "spec_correct_drafts_histogram"} for m in META]
    assert "mtp/accept_rate_pos_1" not in parse_sglang_meta(no_hist, 2)


def test_parse_sglang_meta_rejects_bad_input():
    with pytest.raises(ValueError, match=r"^draft_len=3 is invalid: .*spec_num_proposed_drafts=8 .*"
                                         r"speculative_num_steps"):
        parse_sglang_meta(META, 3)  # SGLang's speculative_num_draft_tokens (k + 1) passed for k
    with pytest.raises(ValueError, match=r"^meta_infos=.* spec_verify_ct > 0 \(is the engine started with"):
        parse_sglang_meta([{"completion_tokens": 5}], 2)
    with pytest.raises(ValueError, match=r"^meta_infos\[0\]=.* spec_num_correct_drafts or spec_accept_rate"):
        parse_sglang_meta([{"completion_tokens": 5, "spec_verify_ct": 2}], 2)
    with pytest.raises(ValueError, match=r"^draft_len=0 is invalid: expected an integer >= 1 \(k, .*"
                                         r"speculative_num_draft_tokens is k \+ 1"):
        parse_sglang_meta(META, 0)


def test_round_starts_follow_the_loop():
    from labkit.mtp.acceptance import round_starts

    assert round_starts([], 1) == []
    assert round_starts([1.0, 1.0, 1.0], 1) == [1.0, 0.0, 1.0]  # accepted: the target emits the next token
    assert round_starts([0.0, 0.0, 0.0], 1) == [1.0, 1.0, 1.0]  # rejected: the next round starts right after
    assert round_starts([0.5, 0.9], 1) == [1.0, 0.5]
    assert round_starts([0.5, 0.5, 0.5], 2) == [1.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="draft_len=0"):
        round_starts([0.5], 0)
