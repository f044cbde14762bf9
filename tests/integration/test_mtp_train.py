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
def _mtp_only(detach: bool, model_dir: str, target: str = "tokens"):
    """Three optimizer steps with only the MTP loss; logits before and after, and the step metrics."""
    from labkit.trainer.group import Trainer

    trainer = Trainer(model_dir, ParallelSpec(), TrainConfig(lr=1e-2, mtp_loss_scale=1.0, mtp_detach=detach,
                                                             mtp_target=target))
    try:
        tokens, mask = arith.batch(arith.problems(16, seed=5))
        before = trainer.forward(tokens)
        steps = [trainer.train_step(tokens, mask, mtp_only=True) for _ in range(3)]
        return before, trainer.forward(tokens), steps
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("target", ["tokens", "policy"])
def test_the_mtp_loss_alone_cannot_move_the_policy(model_dir, target):
    before, after, steps = _mtp_only(True, model_dir, target)
    assert torch.equal(before["logits"], after["logits"])  # bitwise: no trunk, embedding or head update at all
    assert not torch.equal(before["mtp_logits"][0], after["mtp_logits"][0])  # ...while the draft did learn
    key = "mtp/loss" if target == "tokens" else "mtp/kl"
    assert steps[-1][key] < steps[0][key]


def test_the_policy_target_is_the_kl_from_the_main_head_one_position_on(model_dir):
    # Recompute the logged KL from the forward's logits: MTP at t against the main head at t+1, on the targets a
    # draft proposes (the main head reads a response token: the first answer token is never drafted).
    before, _, steps = _mtp_only(True, model_dir, "policy")
    tokens, mask = arith.batch(arith.problems(16, seed=5))
    target = torch.roll(mask.float(), -1, dims=1)
    target[:, -1] = 0  # position j's target is token j+1 (the trainer's loss mask)
    p = torch.log_softmax(before["logits"], -1)[:, 1:]
    q = torch.log_softmax(before["mtp_logits"][0], -1)[:, :-1]
    m = target[:, 1:] * target[:, :-1]
    kl = ((p.exp() * (p - q)).sum(-1) * m).sum() / m.sum()
    assert steps[0]["mtp/kl"] == pytest.approx(float(kl), rel=1e-4)


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


def test_mtp_lr_mult_scales_only_the_draft_step(model_dir):
    # Adam's first step moves every coordinate with a gradient by ~lr: the draft's by lr * mtp_lr_mult.
    from labkit.trainer.group import Trainer

    trainer = Trainer(model_dir, ParallelSpec(), TrainConfig(lr=1e-3, mtp_loss_scale=1.0, mtp_detach=True,
                                                             mtp_lr_mult=4.0))
    try:
        e0 = dict(trainer.export())
        trainer.train_step(*arith.batch(arith.problems(16, seed=7)))
        e1 = dict(trainer.export())
    finally:
        trainer.shutdown()
    step = {n: float((e1[n] - e0[n]).abs().max()) for n in e0}
    draft = max(v for n, v in step.items() if ".mtp_layers." in n)
    trunk = max(v for n, v in step.items() if ".mtp_layers." not in n)
    assert draft == pytest.approx(4e-3, rel=0.05) and trunk == pytest.approx(1e-3, rel=0.05)


@functools.cache
def _trunk_after_rl_steps(model_dir: str, mtp_scale: float, clip: str):
    """Three RL-weighted steps on the same batches with a clip that engages every step; the trunk's exported
    tensors (everything but the draft's own layers) and the step metrics."""
    from labkit.trainer.group import Trainer

    trainer = Trainer(model_dir, ParallelSpec(), TrainConfig(lr=1e-3, mtp_loss_scale=mtp_scale, mtp_detach=True,
                                                             mtp_clip=clip, clip_grad=0.05))
    try:
        adv = torch.tensor([1.0, -0.5] * 4)
        steps = [trainer.train_step(*arith.batch(arith.problems(8, seed=20 + s)), weights=adv) for s in range(3)]
        trunk = {n: t for n, t in trainer.export() if ".mtp_layers." not in n}
    finally:
        trainer.shutdown()
    return trunk, steps


def test_a_training_draft_leaves_the_trunk_bitwise_where_a_frozen_one_does(model_dir):
    """The frozen and trained arms of the MTP experiment, on identical batches: with the MTP layers clipped by their
    own norm (mtp_clip="own", the default) the trunk is bitwise the same after every step."""
    frozen, f_steps = _trunk_after_rl_steps(model_dir, 0.0, "own")
    trained, t_steps = _trunk_after_rl_steps(model_dir, 1.0, "own")
    assert all(m["train/grad_norm"] > 0.05 for m in f_steps + t_steps)  # the clip engaged on every step
    assert all(m["mtp/grad_norm"] > 0.0 for m in t_steps) and all(m["mtp/grad_norm"] == 0.0 for m in f_steps)
    assert frozen.keys() == trained.keys() and all(torch.equal(frozen[n], trained[n]) for n in frozen)


def test_with_one_clip_norm_the_training_draft_moves_the_trunk(model_dir):
    # The control: Megatron's one global norm lets the draft's gradient change the trunk's clip coefficient.
    frozen, _ = _trunk_after_rl_steps(model_dir, 0.0, "own")  # = "global": a frozen draft adds nothing to the norm
    shared, _ = _trunk_after_rl_steps(model_dir, 1.0, "global")
    assert any(not torch.equal(frozen[n], shared[n]) for n in frozen)
