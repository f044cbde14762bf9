"""The pre-RL-only cadence (Bebop): train the draft on the initial policy's own rollouts, then hold it during RL.

Bebop argues a draft need not follow the policy online: train it once, before RL, on what the policy
samples, and keep it. `pretrain_draft` does that phase for one seed and writes a checkpoint the arms then
start from (ExperimentConfig.pre_rl_steps): `frozen` from it is the pre-RL-only cadence, `trained` from it is
pre-RL plus online.

Only the draft moves. Each step is MTP-only (the policy loss is zeroed, TrainConfig.mtp_detach stops the
MTP gradients at the trunk): Adam's trunk update from zero moments is exactly zero, so the trunk, and with it
every rollout, stays bit for bit the checkpoint's (checked: `mtp/pre_rl_trunk_unchanged`). Without that
check a warm-up that leaked into the trunk would make the pre-RL arm a different policy, and its acceptance
would not be comparable with the other runs' (they are paired seed by seed). A fresh trainer then loads the
written checkpoint, so the RL phase starts with fresh optimizer state like every other arm.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from labkit.config import ParallelSpec, check
from labkit.models.tiny import save_weights_as
from labkit.mtp import rl
from labkit.sync import SyncConfig, sync

DRAFT_LAYERS = (".mtp_layers.",)  # HF names of the draft's own layers (MiMo naming)
PROMPT_STREAM = 500_009  # the warm-up's prompt draws: a stream apart from the RL steps'


def is_draft(name: str) -> bool:
    return any(x in name for x in DRAFT_LAYERS)


def pretrain_draft(model_dir: str, engine, placement, cfg, seed: int, task, held: set[str], out_dir: str | Path,
                   progress: bool = True) -> dict:
    """`cfg.pre_rl_steps` MTP-only steps on rollouts of the initial policy (training prompts of `task`, seeded
    sampling), then the trained weights written to `out_dir` (a copy of `model_dir`). `held`: the evaluation
    prompts, counted if ever drawn (never: the task's training draws exclude them). Returns {"model_dir",
    "rows" (per-step metrics), "metrics"}."""
    from tqdm.auto import tqdm

    from labkit.trainer.group import Trainer  # crosses Ray and Megatron

    check(cfg.rl.train.mtp_loss_scale > 0, "mtp_loss_scale", cfg.rl.train.mtp_loss_scale, "> 0 to train a draft")
    train = replace(cfg.rl.train, seed=1234 + seed, mtp_detach=True)  # the draft trains here, whatever the arm
    trainer = Trainer(model_dir, ParallelSpec(), train, placement=placement)
    rows = []
    try:
        s0 = sync(trainer, engine, SyncConfig(progress=False), weight_version=f"pre_rl-{seed}-0")
        check(s0.get("sync/verified") is not False, "sync", s0.get("sync/verified"), "a verified initial sync")
        before = {n: t for n, t in trainer.export() if not is_draft(n)}
        for i in tqdm(range(cfg.pre_rl_steps), desc=f"seed {seed} pre-RL draft", disable=not progress):
            problems = task.problems(cfg.rl.prompts, seed=seed * 1_000_003 + PROMPT_STREAM + i)
            m = rl.step(trainer, engine, problems, cfg.rl, step_index=i, spec_temperature=cfg.spec_temperature,
                        spec_k=cfg.k, task=task, seed=(seed, PROMPT_STREAM, i), mtp_only=True)
            rows.append({"seed": seed, "step": i, **{k: v for k, v in m.items() if not isinstance(v, dict)},
                         "rl/eval_overlap": sum(p.prompt in held for p in problems)})
        named = dict(trainer.export())
    finally:
        trainer.shutdown()
    unchanged = all(named[n].equal(t) for n, t in before.items())
    out = save_weights_as(model_dir, out_dir, named)
    return {"model_dir": str(out), "rows": rows,
            "metrics": {"mtp/pre_rl_trunk_unchanged": unchanged, "mtp/pre_rl_steps": cfg.pre_rl_steps,
                        "mtp/pre_rl_loss_first": rows[0].get("mtp/loss") if rows else None,
                        "mtp/pre_rl_loss_last": rows[-1].get("mtp/loss") if rows else None}}
