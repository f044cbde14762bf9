"""The main job on the embedded default: tiny MiMo model -> Megatron trainer -> a few steps -> export -> check."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from labkit.config import ParallelSpec
from labkit.models.hf import ReferenceModel
from labkit.models.tiny import save_weights_as
from labkit.sync.config import SyncConfig
from labkit.tasks import arith
from labkit.workbench.core import Workbench
from labkit.workbench.experiments import cold_and_warm
from labkit.workbench.viz import PHASES


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
    that was not measured did not pass. Timings are reported, never checked (a loaded machine is no failure).
    """
    tol = EXPORT_TOL.get(m.get("demo/dtype", "float32"), EXPORT_TOL["float32"])

    def number(key: str) -> bool:
        v = m.get(key)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def shown(*keys: str) -> str:
        return ", ".join(f"{k}={m.get(k, 'missing')!r}" for k in keys)

    out = {}
    export = ("export/logits_max_abs_diff", "export/mtp_logits_max_abs_diff")
    out["export parity"] = (None if all(number(k) and m[k] <= tol for k in export)
                            else f"{shown(*export)} (tolerance {tol:g})")
    loss = ("eval/loss_before", "eval/loss_after")
    out["training lowers the loss"] = (None if all(number(k) for k in loss) and m[loss[1]] < m[loss[0]]
                                       else shown(*loss))
    for name, key in (("per-tensor sync verified", "per_tensor/sync/verified"),
                      ("bucketed sync verified", "sync/verified"), ("greedy match", "rollout/greedy_match")):
        out[name] = None if m.get(key) is True else shown(key, *(("rollout/greedy_match_frac",)
                                                                  if key == "rollout/greedy_match" else ()))
    return out


def verdict(m: dict) -> tuple[int, list[str]]:
    """(exit code, failed checks as "check: what failed"): 0 only when every check passed."""
    failed = [f"{name}: {why}" for name, why in checks(m).items() if why is not None]
    return (1 if failed else 0), failed


def accounted(m: dict) -> float:
    """The share of a sync's wall time its phases account for (phases overlap, so it may exceed 1)."""
    return sum(m.get(f"timing/sync/{p}", 0.0) for p in PHASES) / max(m["timing/sync/total"], 1e-9)


def run(workdir: str = "runs/demo", steps: int = 10, tp: int = 1, pp: int = 1, model_dir: str | None = None) -> dict:
    """Pretrained tiny MiMo -> Megatron trainer -> train (eval loss before/after) -> export parity -> sync
    into a real SGLang engine, per-tensor (the baseline) then colocated flattened buckets, each cold then warm ->
    bitwise verify -> greedy engine == trainer."""
    t0 = time.perf_counter()
    out: dict = {}
    with Workbench(model_dir, ParallelSpec(tp=tp, pp=pp)) as wb:  # FINETUNE: settings that lower the loss
        out.update({**wb.timings, "demo/steps": steps})
        out["eval/loss_before"] = wb.eval_loss()
        hist = wb.train(steps)
        out["eval/loss_after"] = wb.eval_loss()
        out.update({"train/loss_first": hist[0]["train/loss"], "train/loss": hist[-1]["train/loss"],
                    "mtp/loss_first": hist[0]["mtp/loss"], "mtp/loss": hist[-1]["mtp/loss"]} if hist else {})
        out.update(export_parity(wb.trainer, workdir))
        cold, base = cold_and_warm(wb, SyncConfig(transport="per-tensor", progress=False))
        out.update({"per_tensor/cold/timing/sync/total": cold["timing/sync/total"],
                    **{f"per_tensor/{k}": v for k, v in base.items() if k.startswith("timing/sync/")},
                    "per_tensor/sync/num_buckets": base["sync/num_buckets"],
                    "per_tensor/sync/verified": base["sync/verified"]})
        wb.train(1, progress=False)  # new weights, so the bucketed sync's verification means something
        cold, m = cold_and_warm(wb, SyncConfig(transport="colocated", bucket_mb=1.0, progress=False))
        out.update({"cold/timing/sync/total": cold["timing/sync/total"],
                    "cold/timing/sync/setup": cold["timing/sync/setup"]})
        out.update({k: v for k, v in m.items() if k.startswith(("sync/", "timing/sync/"))})
        out["demo/speedup_bucketed_vs_per_tensor"] = round(base["timing/sync/total"] / m["timing/sync/total"], 2)
        out["demo/accounted_frac"] = round(accounted(m), 3)
        g = wb.compare_greedy()
        out.update(g.metrics)
        out["rollout/sample"] = g.samples[0]
    out.update({"demo/model_dir": model_dir or "data/tiny-mimo",
                "timing/demo/total": round(time.perf_counter() - t0, 2),
                "demo/dtype": "bfloat16" if torch.cuda.is_available() else "float32",  # the trainer's (rank.load)
                "torch": torch.__version__})
    return out


SUMMARY = (  # one line each; a line whose metrics are missing is left out
    "  trained {demo/steps} steps: loss on a fixed eval batch {eval/loss_before:.3f} -> {eval/loss_after:.3f}; "
    "the export reproduces Megatron's logits to {export/logits_max_abs_diff:.1e}",
    "  synced {sync/mib:.1f} MiB into SGLang, verified bitwise; greedy engine == trainer on "
    "{rollout/greedy_match_frac:.0%} of prompts",
    "  warm sync (what each RL step pays): bucketed {timing/sync/total:.3f} s vs per-tensor "
    "{per_tensor/timing/sync/total:.3f} s, {demo/speedup_bucketed_vs_per_tensor:.1f}x, {accounted}; "
    "the first sync also paid a one-off setup of {cold/timing/sync/setup:.3f} s",
    "  outputs: the exported checkpoint in {export/dir}; metrics above (--json: one JSON line)",
)


def summary(m: dict, failed: list[str]) -> str:
    """What the demo showed, in words, and where its outputs are (the CLI's closing lines)."""
    frac = m.get("demo/accounted_frac", 0.0)
    m = {**m, "sync/mib": m.get("sync/bytes", 0) / 2**20,
         "accounted": f"its phases sum to {frac:.0%} of it" + (" (they overlap: a bucket packs while the last one "
                                                              "loads)" if frac > 1 else "")}
    head = (f"labkit demo: {len(failed)} check(s) failed (above)" if failed else
            "labkit demo: every check passed" + (f" in {m['timing/demo/total']:.0f} s" if "timing/demo/total" in m
                                                 else ""))
    lines = [head]
    for line in SUMMARY:
        try:
            lines.append(line.format_map(m))
        except (KeyError, TypeError, ValueError):
            pass
    return "\n".join(lines)

