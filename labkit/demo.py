"""The main job on the embedded default: tiny MiMo model -> Megatron trainer -> a few steps -> export -> check."""

from __future__ import annotations

import time
from pathlib import Path

from labkit.config import ParallelSpec, TrainConfig
from labkit.sync.session import SyncConfig


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


def export_parity(trainer, workdir: str | Path) -> dict:
    """Export -> a fresh transformers model (and MiMo's MTP order) must reproduce the trainer's logits."""
    from labkit.models.hf import ReferenceModel
    from labkit.models.tiny import save_weights_as
    from labkit.tasks import arith

    named = trainer.export()
    out_dir = save_weights_as(trainer.model_dir, Path(workdir) / "exported", named)
    tokens, _ = arith.batch(arith.problems(4, seed=12345))
    mine, ref = trainer.forward(tokens), ReferenceModel(out_dir).forward(tokens)
    vocab = ref["logits"].shape[-1]
    diff = float((mine["logits"][..., :vocab] - ref["logits"]).abs().max())
    mtp = max((float((a[..., :vocab] - b).abs().max()) for a, b in zip(mine["mtp_logits"], ref["mtp_logits"])),
              default=0.0)
    return {"export/num_tensors": len(named), "export/params": sum(t.numel() for _, t in named),
            "export/logits_max_abs_diff": diff, "export/mtp_logits_max_abs_diff": mtp, "export/dir": str(out_dir)}


def run(workdir: str = "runs/demo", steps: int = 10, tp: int = 1, pp: int = 1, model_dir: str | None = None) -> dict:
    """Pretrained tiny MiMo -> Megatron trainer -> train -> export parity -> sync into a real SGLang engine
    (per-tensor baseline, then colocated flattened buckets) -> bitwise verify -> greedy engine == trainer."""
    import torch

    from labkit.workbench import Workbench

    t0 = time.perf_counter()
    out: dict = {}
    with Workbench(model_dir, ParallelSpec(tp=tp, pp=pp), TrainConfig()) as wb:
        out.update(wb.timings)
        hist = wb.train(steps)
        out.update({"train/loss_first": hist[0]["train/loss"], "train/loss": hist[-1]["train/loss"],
                    "mtp/loss_first": hist[0]["mtp/loss"], "mtp/loss": hist[-1]["mtp/loss"]} if hist else {})
        out.update(export_parity(wb.trainer, workdir))
        base = wb.sync(SyncConfig(transport="per-tensor", progress=False))
        out.update({"per_tensor/timing/sync/total": base["timing/sync/total"],
                    "per_tensor/sync/verified": base["sync/verified"]})
        wb.train(1, progress=False)
        m = wb.sync(SyncConfig(transport="colocated", bucket_mb=1.0, progress=False))
        out.update({k: v for k, v in m.items() if k.startswith(("sync/", "timing/sync/"))})
        g = wb.compare_greedy()
        out.update({k: v for k, v in g.items() if k != "rollout/samples"})
        out["rollout/sample"] = g["rollout/samples"][0]
    out.update({"demo/model_dir": model_dir or "data/tiny-mimo", "timing/demo/total": round(time.perf_counter() - t0, 2),
                "torch": torch.__version__})
    return out
