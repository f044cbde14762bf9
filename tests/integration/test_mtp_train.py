"""MTP training during RL on the real Megatron trainer: the trunk is detached from the MTP loss, and a frozen draft
stays frozen."""

import functools

import pytest
import torch

from labkit.config import ModelSpec, ParallelSpec, TrainConfig
from labkit.models.tiny import make_tiny_mimo
from labkit.tasks import arith

pytestmark = pytest.mark.integration

SPEC = ModelSpec(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seed=5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_mimo(tmp_path_factory.mktemp("mtp_train") / "tiny", SPEC))


@functools.cache
def _mtp_only(detach: bool, model_dir: str):
    """Three optimizer steps with only the MTP loss; logits before and after, and the step metrics."""
    from labkit.trainer.group import Trainer

    trainer = Trainer(model_dir, ParallelSpec(), TrainConfig(lr=1e-2, mtp_loss_scale=1.0, mtp_detach=detach))
    try:
        tokens, mask = arith.batch(arith.problems(16, seed=5))
        before = trainer.forward(tokens)
        steps = [trainer.train_step(tokens, mask, mtp_only=True) for _ in range(3)]
        return before, trainer.forward(tokens), steps
    finally:
        trainer.shutdown()


def test_the_mtp_loss_alone_cannot_move_the_policy(model_dir):
    before, after, steps = _mtp_only(True, model_dir)
    assert torch.equal(before["logits"], after["logits"])  # bitwise: no trunk, embedding or head update at all
    assert not torch.equal(before["mtp_logits"][0], after["mtp_logits"][0])  # ...while the draft did learn
    assert steps[-1]["mtp/loss"] < steps[0]["mtp/loss"]


def test_without_the_detach_the_same_steps_do_move_the_policy(model_dir):
    # The control that shows the test above can fail: Megatron's MTP loss reaches the trunk by default.
    before, after, _ = _mtp_only(False, model_dir)
    assert not torch.equal(before["logits"], after["logits"])


def test_mtp_loss_scale_zero_freezes_the_draft_while_the_policy_trains(model_dir):
    from labkit.trainer.group import Trainer

    trainer = Trainer(model_dir, ParallelSpec(), TrainConfig(lr=1e-2, mtp_loss_scale=0.0, mtp_detach=True))
    try:
        assert trainer.info[0]["mtp_frozen_tensors"] > 0
        e0 = dict(trainer.export())
        tokens, mask = arith.batch(arith.problems(8, seed=6))
        adv = torch.tensor([1.0, -1.0] * 4)  # RL weights: half the sequences pushed down
        trainer.train_step(tokens, mask, weights=adv)
        e1 = dict(trainer.export())
    finally:
        trainer.shutdown()
    draft = [n for n in e0 if ".mtp_layers." in n]
    assert draft and all(torch.equal(e0[n], e1[n]) for n in draft)
    assert any(not torch.equal(e0[n], e1[n]) for n in e0 if n not in draft)
