"""The main job on the embedded default: tiny MiMo model -> Megatron trainer -> a few steps -> export -> check."""

from __future__ import annotations

import math
import time
from pathlib import Path

from labkit.config import ParallelSpec, TrainConfig
from labkit.models.hf import ReferenceModel
from labkit.models.tiny import save_weights_as
from labkit.sync.config import SyncConfig
from labkit.tasks import arith
from labkit.workbench.core import Workbench


def export_parity(trainer, workdir: str | Path) -> dict:
    """Export -> a fresh transformers model (and MiMo's MTP order) must reproduce the trainer's logits."""
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


# Export parity: fp32 runs agree to ~1e-5 (main head) / ~1e-4 (MTP head, tests/integration/test_trainer.py); a
# wrong mapping (e.g. MiMo's eh_proj halves unswapped) is off by > 1e-2. bf16 (CUDA) rounds far coarser.
EXPORT_TOL = {"float32": 1e-3, "bfloat16": 5e-2}


def checks(m: dict) -> dict[str, str | None]:
    """The demo's pass/fail checks on its metrics: {check: None if it passed, else what failed (keys, values)}.

    Pure, so the exit decision is tested without running the demo. A missing metric fails its check: a check
    that was not measured did not pass.
    """
    tol = EXPORT_TOL.get(m.get("demo/dtype", "float32"), EXPORT_TOL["float32"])

    def close(key: str) -> bool:
        v = m.get(key)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v <= tol

    def shown(*keys: str) -> str:
        return ", ".join(f"{k}={m.get(k, 'missing')!r}" for k in keys)

    out = {}
    export = ("export/logits_max_abs_diff", "export/mtp_logits_max_abs_diff")
    out["export parity"] = None if all(close(k) for k in export) else f"{shown(*export)} (tolerance {tol:g})"
    for name, key in (("per-tensor sync verified", "per_tensor/sync/verified"),
                      ("bucketed sync verified", "sync/verified"), ("greedy match", "rollout/greedy_match")):
        out[name] = None if m.get(key) is True else shown(key, *(("rollout/greedy_match_frac",)
                                                                  if key == "rollout/greedy_match" else ()))
    return out


def verdict(m: dict) -> tuple[int, list[str]]:
    """(exit code, failed checks as "check: what failed"): 0 only when every check passed."""
    failed = [f"{name}: {why}" for name, why in checks(m).items() if why is not None]
    return (1 if failed else 0), failed


def run(workdir: str = "runs/demo", steps: int = 10, tp: int = 1, pp: int = 1, model_dir: str | None = None) -> dict:
    """Pretrained tiny MiMo -> Megatron trainer -> train -> export parity -> sync into a real SGLang engine
    (per-tensor baseline, then colocated flattened buckets) -> bitwise verify -> greedy engine == trainer."""
    import torch


    t0 = time.perf_counter()
    out: dict = {}
    with Workbench(model_dir, ParallelSpec(tp=tp, pp=pp), train_cfg=TrainConfig()) as wb:
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
        out.update(g.metrics)
        out["rollout/sample"] = g.samples[0]
    out.update({"demo/model_dir": model_dir or "data/tiny-mimo", "timing/demo/total": round(time.perf_counter() - t0, 2),
                "demo/dtype": "bfloat16" if torch.cuda.is_available() else "float32",  # the trainer's (rank.load)
                "torch": torch.__version__})
    return out
