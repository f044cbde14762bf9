"""Pretrain a tiny MiMo model (trunk and MTP head together) on a task's noisy corpus.

The results ship in data/: `tiny-mimo` (the arithmetic task) so demos, notebooks and tests start from a model
whose greedy output is digits and whose MTP draft is already useful, and `tiny-mimo-chain` (the long-answer
task, labkit.tasks.chain). `labkit pretrain [--task chain]` rebuilds either bit for bit on the same stack.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from labkit.config import ModelSpec, ParallelSpec, TrainConfig, check
from labkit.models.tiny import DEFAULT_DIR, default_model_dir, make_tiny_mimo, save_weights_as
from labkit.tasks import TASKS, ArithTask
from labkit.trainer.group import Trainer

CHAIN_DIR = Path(default_model_dir("chain"))
RECIPES = {
    "arith": {"out": DEFAULT_DIR, "steps": 2400, "batch_size": 64, "lr": 2e-3, "noise": 0.25, "post_steps": 600,
              "post_lr": 5e-4, "post_noise": 0.15},
    # Chains are 141 tokens (arith: ~10): fewer, smaller steps; the noise is per sum (a slip the chain continues
    # from), so 0.05 is a slip in about half the answers.
    "chain": {"out": CHAIN_DIR, "steps": 1500, "batch_size": 32, "lr": 2e-3, "noise": 0.05, "post_steps": 300,
              "post_lr": 5e-4, "post_noise": 0.01},
}
"""Each shipped checkpoint's recipe: `pretrain(task=...)`'s defaults."""


def lm_batch(problems, answer_only: bool = True, task=None):
    """Solved problems ("37+45=82</s>"); loss on the answer tokens (the operands are random: loss there is noise
    the model cannot learn), or on every predicted token."""
    tokens, mask = (task or ArithTask()).batch(problems)
    if not answer_only:
        mask = (tokens != 0).long()
        mask[:, 0] = 0  # the first token has no predictor
    return tokens, mask


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to lr / 10."""
    import math

    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _train(trainer, task, steps: int, lr: float, warmup: int, noise: float, batch_size: int, data_seed: int,
           desc: str, progress: bool) -> dict:
    from tqdm.auto import tqdm

    m = {}
    for step in tqdm(range(steps), desc=desc, disable=not progress, mininterval=2.0):
        trainer.set_lr(lr_at(step, steps, lr, warmup))
        seed = data_seed + step
        m = trainer.train_step(*lm_batch(task.corrupt(task.problems(batch_size, seed=seed), noise, seed=seed),
                                         task=task))
    return m


def pretrain(out_dir: str | Path | None = None, spec: ModelSpec | None = None, *, task: str = "arith",
             steps: int | None = None, batch_size: int | None = None, lr: float | None = None, warmup: int = 50,
             noise: float | None = None, post_steps: int | None = None, post_lr: float | None = None,
             post_noise: float | None = None, seed: int = 0, progress: bool = True) -> dict:
    """Two stages, like a released MTP model (MiMo's draft starts behind its RL policy: verl #5561's 44 %).

    1. Trunk and MTP head together, `steps` on a corpus whose answer digits are wrong with probability `noise`:
       the model learns the sums and, at T=1, the noise it was taught.
    2. Post-training of the trunk alone (MTP layers frozen, fresh optimizer), `post_steps` on a cleaner corpus
       (`post_noise`): the policy gets sharper and its hidden states move, the draft does not follow.
    Both stages draw from the task's training problems only: its held-out set (named in pretrain.json by
    `pretrain/held_out_digest`) is never seen, so evaluations on it are held out. None arguments take the
    task's recipe (RECIPES), the one its shipped checkpoint was made with.
    So RL starts with room to move the policy (greedy accuracy 0.91 on the held-out problems, T=1 reward ~0.69)
    and a useful but stale draft (T=1 accept rate ~0.80; ~0.85 after 60 RL steps of MTP training:
    data/mtp_experiment_cpu.json).
    """
    import tempfile

    check(task in RECIPES, "task", task, f"one of {', '.join(RECIPES)}")
    given = {"out": out_dir, "steps": steps, "batch_size": batch_size, "lr": lr, "noise": noise,
             "post_steps": post_steps, "post_lr": post_lr, "post_noise": post_noise}
    r = {**RECIPES[task], **{k: v for k, v in given.items() if v is not None}}
    out_dir, steps, batch_size, lr, noise = r["out"], r["steps"], r["batch_size"], r["lr"], r["noise"]
    post_steps, post_lr, post_noise = r["post_steps"], r["post_lr"], r["post_noise"]
    task_obj = TASKS[task]()
    spec = spec or ModelSpec()
    t0 = time.perf_counter()
    data_seed = 10_000 + seed * 1_000_003
    with tempfile.TemporaryDirectory() as tmp:
        init = make_tiny_mimo(Path(tmp) / "init", spec)
        # One clip norm over trunk and MTP (Megatron's), the recipe data/tiny-mimo was made with: bit for bit.
        trainer = Trainer(str(init), ParallelSpec(), TrainConfig(lr=lr, mtp_loss_scale=1.0, adam_beta2=0.98, seed=seed,
                                                                 mtp_clip="global"))
        try:
            m1 = _train(trainer, task_obj, steps, lr, warmup, noise, batch_size, data_seed, "pretrain", progress)
            out = save_weights_as(init, Path(tmp) / "stage1", trainer.export())
        finally:
            trainer.shutdown()
        m2 = {}
        if post_steps:
            trainer = Trainer(str(out), ParallelSpec(), TrainConfig(lr=post_lr, mtp_loss_scale=0.0, adam_beta2=0.98,
                                                                    seed=seed + 1, mtp_clip="global"))
            try:
                m2 = _train(trainer, task_obj, post_steps, post_lr, 20, post_noise, batch_size,
                            50_000 + seed * 1_000_003, "post-train (trunk only)", progress)
                out = save_weights_as(init, Path(tmp) / "stage2", trainer.export())
            finally:
                trainer.shutdown()
        out = save_weights_as(init, out_dir, dict(_load(out)))
    summary = {"pretrain/task": task, "pretrain/steps": steps, "pretrain/batch_size": batch_size, "pretrain/lr": lr,
               "pretrain/warmup": warmup, "pretrain/adam_beta2": 0.98, "pretrain/noise": noise,
               "pretrain/post_steps": post_steps, "pretrain/post_lr": post_lr, "pretrain/post_noise": post_noise,
               "pretrain/seed": seed, "pretrain/held_out": task_obj.evaluation_size(),
               "pretrain/held_out_digest": task_obj.evaluation_digest(),
               "pretrain/spec": {f: getattr(spec, f) for f in spec.__slots__},
               "train/loss": m1["train/loss"], "mtp/loss": m1["mtp/loss"],
               "post/train_loss": m2.get("train/loss"), "post/mtp_loss_on_post_data": m2.get("mtp/loss"),
               "timing/pretrain/total": round(time.perf_counter() - t0, 2)}
    (Path(out) / "pretrain.json").write_text(json.dumps(summary, indent=2))
    return {"pretrain/dir": str(out), **summary}


def _load(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))
