"""Pretrain the tiny MiMo model (trunk and MTP head together) on the arithmetic corpus.

The result ships in data/tiny-mimo so demos, notebooks and tests start from a model whose greedy output is
digits and whose MTP draft is already useful; `labkit pretrain` rebuilds it bit for bit on the same stack.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from labkit.config import ModelSpec, ParallelSpec, TrainConfig

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "data" / "tiny-mimo"


def lm_batch(problems, answer_only: bool = True):
    """Solved problems ("37+45=82</s>"); loss on the answer tokens (the operands are random: loss there is noise
    the model cannot learn), or on every predicted token."""
    from labkit.tasks import arith

    tokens, mask = arith.batch(problems)
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


def pretrain(out_dir: str | Path = DEFAULT_DIR, spec: ModelSpec | None = None, steps: int = 800,
             batch_size: int = 64, lr: float = 2e-3, warmup: int = 50, seed: int = 0, progress: bool = True) -> dict:
    """Short on purpose: the checkpoint answers about half the problems, so RL has room to move the policy."""
    import tempfile

    from tqdm.auto import tqdm

    from labkit.models.tiny import make_tiny_mimo, save_weights_as
    from labkit.tasks import arith
    from labkit.trainer.group import Trainer

    spec = spec or ModelSpec()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        init = make_tiny_mimo(Path(tmp) / "init", spec)
        trainer = Trainer(str(init), ParallelSpec(), TrainConfig(lr=lr, mtp_loss_scale=1.0, adam_beta2=0.98, seed=seed))
        try:
            history = []
            for step in tqdm(range(steps), desc="pretrain", disable=not progress, mininterval=2.0):
                trainer.set_lr(lr_at(step, steps, lr, warmup))
                m = trainer.train_step(*lm_batch(arith.problems(batch_size, seed=10_000 + seed * 1_000_003 + step)))
                history.append(m)
            out = save_weights_as(init, out_dir, trainer.export())
        finally:
            trainer.shutdown()
    summary = {"pretrain/steps": steps, "pretrain/batch_size": batch_size, "pretrain/lr": lr,
               "pretrain/warmup": warmup, "pretrain/adam_beta2": 0.98, "pretrain/seed": seed,
               "pretrain/spec": {f: getattr(spec, f) for f in spec.__slots__},
               "train/loss": history[-1]["train/loss"], "mtp/loss": history[-1]["mtp/loss"],
               "timing/pretrain/total": round(time.perf_counter() - t0, 2)}
    (Path(out) / "pretrain.json").write_text(json.dumps(summary, indent=2))
    return {"pretrain/dir": str(out), **summary}
