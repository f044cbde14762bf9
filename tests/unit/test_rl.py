"""Pure parts of the MTP RL loop: advantages, batches, configs."""

import math

import pytest
import torch

from labkit.config import TrainConfig
from labkit.mtp.experiment import ExperimentConfig, with_overrides
from labkit.mtp.rl import RLConfig, advantages, to_batch
from labkit.trainer.steps import make_batch as _make_batch


def test_advantages_are_normalised_within_each_group():
    adv = advantages([1, 0, 0, 0, 1, 1, 1, 1], group=4)
    assert adv[4:] == [0.0] * 4  # an all-equal group carries no signal
    assert math.isclose(sum(adv[:4]), 0.0, abs_tol=1e-9)
    assert adv[0] > 0 > adv[1] and math.isclose(adv[0], math.sqrt(3), rel_tol=1e-5)


def test_advantages_reject_a_ragged_batch():
    with pytest.raises(ValueError, match="rewards=5"):
        advantages([1, 0, 0, 0, 1], group=4)


def test_to_batch_masks_completions_and_the_drafted_tokens():
    rows = [{"prompt_ids": [5, 6, 7], "tokens": [8, 9, 2]}, {"prompt_ids": [5, 6], "tokens": [8]}]
    tokens, mask, drafted = to_batch(rows)
    assert tokens.tolist() == [[5, 6, 7, 8, 9, 2], [5, 6, 8, 0, 0, 0]]
    assert mask.tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 0]]
    assert drafted.tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]]  # the prefill emits the first token


def test_policy_loss_is_normalised_by_tokens_not_by_the_advantage_sum():
    tokens = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
    b = _make_batch(tokens, mask, torch.tensor([1.0, -1.0]))
    assert float(b["weights"].sum()) == 0.0  # advantages cancel...
    assert float(b["loss_mask"].sum()) == 4.0  # ...the MTP mask and the normaliser do not
    assert b["weights"][1].tolist() == [0.0, -1.0, -1.0, 0.0]


@pytest.mark.parametrize("bad, match", [(dict(group=1), "group=1"), (dict(temperature=0.0), "temperature=0.0"),
                                        (dict(prompts=0), "prompts=0"), (dict(probe=-1), "probe=-1"),
                                        (dict(probe=True), "probe=True"),
                                        (dict(train=TrainConfig(mtp_detach=False)), "train.mtp_detach=False")])
def test_rl_config_names_the_bad_value(bad, match):
    with pytest.raises(ValueError, match=match):
        RLConfig(**bad)


def test_rl_config_holds_a_train_config_instead_of_repeating_its_fields():
    repeated = set(RLConfig.__dataclass_fields__) & set(TrainConfig.__dataclass_fields__)
    assert not repeated, repeated  # lr/MTP settings live in one place: RLConfig.train
    t = RLConfig().train
    assert (t.lr, t.mtp_loss_scale, t.mtp_detach, t.mtp_lr_mult, t.mtp_target) == (2e-4, 1.0, True, 5.0, "tokens")


@pytest.mark.parametrize("bad, match", [(dict(k=0), "k=0"), (dict(spec_temperature=-1.0), "spec_temperature=-1.0"),
                                        (dict(arms=("trained", "nope")), "arms="), (dict(steps=0), "steps=0")])
def test_experiment_config_names_the_bad_value(bad, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**bad)


def test_overrides_route_rl_fields():
    cfg = with_overrides(ExperimentConfig(), steps=3, group=2, lr=None, mtp_lr_mult=2.0, seeds=(7,))
    assert cfg.steps == 3 and cfg.rl.group == 2 and cfg.rl.train.lr == RLConfig().train.lr
    assert cfg.rl.train.mtp_lr_mult == 2.0 and cfg.seeds == (7,) and cfg.rl.train.seed == TrainConfig().seed
    with pytest.raises(ValueError, match="mtp_target='kl'"):
        with_overrides(ExperimentConfig(), mtp_target="kl")


def test_the_long_task_brings_its_answer_budget_and_checkpoint():
    from labkit.models.tiny import default_model_dir

    cfg = with_overrides(ExperimentConfig(), task="chain")
    assert cfg.task == "chain" and cfg.rl.max_new_tokens == 136
    assert with_overrides(ExperimentConfig(), task="chain", max_new_tokens=140).rl.max_new_tokens == 140
    with pytest.raises(ValueError, match="max_new_tokens=5 is invalid: expected >= 136, the chain task's"):
        ExperimentConfig(task="chain")
    with pytest.raises(ValueError, match="task='sums' is invalid"):
        ExperimentConfig(task="sums")
    assert default_model_dir("chain").endswith("data/tiny-mimo-chain")


def test_corrupt_noises_answer_digits_at_the_rate_and_keeps_prompts():
    from labkit.tasks import arith

    items = arith.problems(4000, seed=1)
    noisy = arith.corrupt(items, 0.25, seed=2)
    digits = [(a, b) for p, q in zip(items, noisy) for a, b in zip(p.answer, q.answer)]
    assert [p.prompt for p in items] == [q.prompt for q in noisy]
    assert all(len(p.answer) == len(q.answer) for p, q in zip(items, noisy))
    assert abs(sum(a != b for a, b in digits) / len(digits) - 0.25) < 0.02  # a flip always changes the digit
    assert arith.corrupt(items, 0.0) == items
    with pytest.raises(ValueError, match="rate=1.5"):
        arith.corrupt(items, 1.5)


def _logprob_rows():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    logp = torch.log_softmax(logits, dim=-1)
    rows = [{"prompt_ids": [5, 6, 7], "tokens": [8, 9, 2], "logprobs": None},  # engine sent none
            {"prompt_ids": [5, 6], "tokens": [8, 3], "logprobs": [float(logp[1, 1, 8]) + 0.5, float(logp[1, 2, 3])]}]
    return logits, rows


def test_rollout_kl_never_reports_a_gap_it_did_not_measure():
    """Issue 16: rows without engine log-probs read as a gap of 0 (perfect agreement)."""
    from labkit.mtp.rl import rollout_kl

    logits, rows = _logprob_rows()
    m = rollout_kl(logits, rows)
    assert m["train/rollout_logprob_missing_rows"] == 1
    assert m["train/rollout_logprob_max_abs_diff"] == pytest.approx(0.5, abs=1e-5)  # the measured row only
    assert m["train/rollout_kl"] == pytest.approx(0.25, abs=1e-5)
    none = rollout_kl(logits, [rows[0], {**rows[1], "logprobs": None}])
    assert math.isnan(none["train/rollout_kl"]) and math.isnan(none["train/rollout_logprob_max_abs_diff"])
    assert none["train/rollout_logprob_missing_rows"] == 2
    ragged = rollout_kl(logits, [{**rows[1], "logprobs": rows[1]["logprobs"][:1]}])  # one log-prob, two tokens
    assert ragged["train/rollout_logprob_missing_rows"] == 1 and math.isnan(ragged["train/rollout_kl"])


def test_logprob_agreement_refuses_rows_without_engine_logprobs():
    from types import SimpleNamespace

    from labkit.workbench.experiments import logprob_agreement

    logits, rows = _logprob_rows()
    calls = []
    wb = SimpleNamespace(trainer=SimpleNamespace(forward=lambda t: calls.append(t) or {"logits": logits}))
    with pytest.raises(ValueError, match=r"1 of 2 rows carry no engine log-probs.*rows \[0\].*output_token_logprobs"):
        logprob_agreement(wb, rows)
    assert not calls  # refused before the trainer's forward
    wb1 = SimpleNamespace(trainer=SimpleNamespace(forward=lambda t: {"logits": logits[1:, : t.shape[1]]}))
    m = logprob_agreement(wb1, rows[1:])
    assert len(m["engine"]) == len(m["trainer"]) == 2 and m["max_abs_diff"] == pytest.approx(0.5, abs=1e-5)
