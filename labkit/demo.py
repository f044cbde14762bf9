"""The main job on the embedded default: tiny MiMo model -> Megatron trainer -> a few steps -> export -> check."""

from __future__ import annotations

import time
from pathlib import Path

from labkit.config import ModelSpec, ParallelSpec, TrainConfig


def train(trainer, steps: int, batch_size: int = 16, seed: int = 0, progress: bool = True) -> list[dict]:
    """Supervised steps on the arithmetic corpus (answer tokens only). Returns per-step metrics."""
    from tqdm.auto import tqdm

    from labkit.tasks import arith

    history = []
    bar = tqdm(range(steps), desc="train", disable=not progress, mininterval=1.0)
    for step in bar:
        tokens, mask = arith.batch(arith.problems(batch_size, seed=seed * 100_003 + step))
        m = trainer.train_step(tokens, mask)
        history.append({"step": step, **m})
        bar.set_postfix(loss=f"{m['train/loss']:.3f}", mtp=f"{m['mtp/loss']:.3f}")
    return history


def run(workdir: str = "runs/demo", steps: int = 20, tp: int = 1, pp: int = 1, spec: ModelSpec | None = None) -> dict:
    import torch

    from labkit.models.hf import ReferenceModel
    from labkit.models.tiny import make_tiny_mimo, save_weights_as
    from labkit.tasks import arith
    from labkit.trainer.group import Trainer

    t0 = time.perf_counter()
    work = Path(workdir)
    model_dir = make_tiny_mimo(work / "model", spec or ModelSpec())
    trainer = Trainer(str(model_dir), ParallelSpec(tp=tp, pp=pp), TrainConfig())
    t_build = time.perf_counter() - t0
    history = train(trainer, steps)
    named = trainer.export()
    out_dir = save_weights_as(model_dir, work / "exported", named)
    # The exported checkpoint, run by transformers (trunk) and MiMo's MTP order, must reproduce the trainer.
    tokens, _ = arith.batch(arith.problems(4, seed=12345))
    mine, ref = trainer.forward(tokens), ReferenceModel(out_dir).forward(tokens)
    vocab = ref["logits"].shape[-1]
    diff = float((mine["logits"][..., :vocab] - ref["logits"]).abs().max())
    mtp_diff = max((float((a[..., :vocab] - b).abs().max()) for a, b in zip(mine["mtp_logits"], ref["mtp_logits"])),
                   default=0.0)
    trainer.shutdown()
    return {
        "demo/model_dir": str(model_dir),
        "demo/exported_dir": str(out_dir),
        "demo/params": sum(t.numel() for _, t in named),
        "demo/num_tensors": len(named),
        "demo/steps": steps,
        "train/loss_first": history[0]["train/loss"] if history else None,
        "train/loss": history[-1]["train/loss"] if history else None,
        "mtp/loss_first": history[0]["mtp/loss"] if history else None,
        "mtp/loss": history[-1]["mtp/loss"] if history else None,
        "export/logits_max_abs_diff": diff,
        "export/mtp_logits_max_abs_diff": mtp_diff,
        "timing/demo/build": round(t_build, 2),
        "timing/demo/total": round(time.perf_counter() - t0, 2),
        "torch": torch.__version__,
    }
