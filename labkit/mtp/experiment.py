"""Does the MTP draft keep up when RL moves the policy? Three arms, same seeds, prompts and engine.

  frozen    the MTP layer is not trained (mtp_loss_scale 0); everything is synced, so the draft reads the
            current trunk states and the current shared embedding/output head through a step-0 MTP layer
  trained   MTP loss on the response tokens, trunk detached (labkit.mtp.loss); everything synced
  unsynced  trained like `trained`, but each sync sends the trunk only: the draft the engine holds stays
            as at step 0, its own embedding/head copies included (a draft worker with separate weights,
            the vime #351 / miles #1926 failure)

Every step: export -> acceptance measured by labkit's speculative loop (labkit.mtp.speculative) over the
exported weights the engine serves, on fixed held-out prompts -> one RL step (labkit.mtp.rl), which rolls
out from the engine, estimates acceptance offline from its teacher-forced forward, trains and syncs.
k defaults to 1, MiMo's own SGLang recipe (1 step, top-k 1, 2 draft tokens), so the measured accept
rate is the per-token acceptance `a` that the offline estimate predicts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from labkit.cluster import runtime
from labkit.cluster.placement import Placement, layout
from labkit.config import ParallelSpec, TrainConfig, check
from labkit.engine import EngineConfig, EngineHandle
from labkit.models.hf import read_config_json
from labkit.models.tiny import default_model_dir
from labkit.mtp import rl
from labkit.mtp.acceptance import expected_accept_length
from labkit.mtp.rl import RLConfig
from labkit.sync import SyncConfig, sync
from labkit.tasks import ArithTask

Arm = Literal["frozen", "trained", "unsynced"]
ARMS = get_args(Arm)
DRAFT_LAYERS = (".mtp_layers.",)  # HF names of the draft's own layers (MiMo naming)
DRAFT_SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # what a separate draft model holds a copy of


@dataclass(kw_only=True, slots=True, frozen=True)
class ExperimentConfig:
    steps: int = 60
    arms: tuple[Arm, ...] = ARMS
    k: int = 1  # drafts per verify step (draft_len; SGLang: speculative_num_steps, its num_draft_tokens is k + 1)
    spec_temperature: float = 1.0  # the rollout temperature: what RL serves
    eval_prompts: int = 256
    seed: int = 0
    rl: RLConfig = field(default_factory=RLConfig)

    def __post_init__(self) -> None:
        check(isinstance(self.steps, int) and self.steps >= 1, "steps", self.steps, "an integer >= 1")
        check(bool(self.arms) and all(a in ARMS for a in self.arms), "arms", self.arms,
              f"a non-empty subset of {', '.join(ARMS)}")
        check(isinstance(self.k, int) and self.k >= 1, "k", self.k, "an integer >= 1")
        check(isinstance(self.spec_temperature, (int, float)) and self.spec_temperature >= 0,
              "spec_temperature", self.spec_temperature, ">= 0")
        check(isinstance(self.eval_prompts, int) and self.eval_prompts >= 1, "eval_prompts", self.eval_prompts,
              "an integer >= 1")

    @classmethod
    def quick(cls, **kw) -> ExperimentConfig:
        """Seconds per step, for tests and smoke runs: the numbers mean little."""
        return cls(**{"steps": 2, "eval_prompts": 16, "rl": RLConfig(prompts=4, group=4), **kw})


def measure(model_dir: str, named: dict, draft: dict | None, eval_ids: list[list[int]], cfg: ExperimentConfig,
            seed: int) -> dict:
    """Speculative decoding with the MTP draft over the given weights; acceptance under stable keys."""
    from labkit.mtp.speculative import Speculator  # torch; the CLI imports this module for its config

    speculator = Speculator(model_dir, named, draft_weights=draft)
    out = speculator.generate(eval_ids, k=cfg.k, temperature=cfg.spec_temperature, max_new_tokens=cfg.rl.max_new_tokens,
                        seed=seed, progress=False)
    return {k: v for k, v in out["metrics"].items() if k.startswith("mtp/")}


def speculate(model_dir: str | None = None, *, k: int = 2, temperature: float = 1.0, prompts: int = 256,
              seed: int = 0, task=None) -> dict:
    """Speculative decoding with a checkpoint's own MTP draft on held-out prompts, no RL: SGLang-named counters
    (accept length, per-position rates) and the accept length theory predicts from the depth-1 rate."""
    from labkit.mtp.speculative import Speculator  # torch; the CLI imports this module for its config

    model_dir = model_dir or default_model_dir()
    task = task or ArithTask()
    ids = [task.tokenizer.encode(p.prompt) for p in task.problems(prompts, seed=999_983 + seed)]
    out = Speculator(model_dir).generate(ids, k=k, temperature=temperature, max_new_tokens=RLConfig().max_new_tokens,
                                         seed=seed)
    m = dict(out["metrics"])
    m["mtp/theory_accept_length"] = expected_accept_length(m["mtp/accept_rate_pos_1"], k)
    m["mtp/k"], m["mtp/spec_temperature"] = k, temperature
    return {"metrics": m, "requests": out["requests"]}


def run_arm(arm: str, engine, placement, model_dir: str, cfg: ExperimentConfig, progress: bool = True,
            task=None) -> list[dict]:
    from tqdm.auto import tqdm


    task = task or ArithTask()
    scale = 0.0 if arm == "frozen" else cfg.rl.train.mtp_loss_scale
    train = replace(cfg.rl.train, mtp_loss_scale=scale, seed=1234 + cfg.seed)
    from labkit.trainer.group import Trainer  # crosses Ray and Megatron: the CLI imports this module for its config

    trainer = Trainer(model_dir, ParallelSpec(), train, placement=placement)
    rows = []
    try:
        s0 = sync(trainer, engine, SyncConfig(progress=False), weight_version=f"{arm}-0")  # every arm starts equal
        check(s0.get("sync/verified") is not False, "sync", s0.get("sync/verified"), "a verified initial sync")
        eval_problems = task.problems(cfg.eval_prompts, seed=999_983 + cfg.seed)
        eval_ids = [task.tokenizer.encode(p.prompt) for p in eval_problems]
        draft0 = None
        exclude = DRAFT_LAYERS if arm == "unsynced" else ()
        bar = tqdm(range(cfg.steps + 1), desc=f"arm {arm}", disable=not progress)
        for step in bar:
            t0 = time.perf_counter()
            named = dict(trainer.export())
            if arm == "unsynced" and draft0 is None:
                draft0 = {n: t.clone() for n, t in named.items()
                          if any(x in n for x in DRAFT_LAYERS) or n in DRAFT_SHARED}
            acc = measure(model_dir, named, draft0, eval_ids, cfg, seed=cfg.seed * 7919 + step)
            problems = task.problems(cfg.rl.prompts, seed=cfg.seed * 1_000_003 + 17 * (step + 1))
            m = rl.step(trainer, engine, problems, cfg.rl, step_index=step, eval_problems=eval_problems[:64],
                        train=step < cfg.steps, exclude=exclude, spec_temperature=cfg.spec_temperature,
                        spec_k=cfg.k, task=task)
            rows.append({"arm": arm, "step": step, **acc, **m, "timing/step": round(time.perf_counter() - t0, 2)})
            bar.set_postfix(reward=f"{m['train/reward']:.2f}", accept=f"{acc['mtp/accept_rate']:.2f}")
    finally:
        trainer.shutdown()
    return rows


def summarize(history: list[dict], cfg: ExperimentConfig) -> dict:
    """The JSON the CLI prints: per-arm curves and the headline numbers."""
    arms = {a: [r for r in history if r["arm"] == a] for a in cfg.arms}
    out: dict = {"mtp/arms": {a: [{"step": r["step"], "accept_length": r["mtp/accept_length"],
                                   "accept_rate": r["mtp/accept_rate"], "reward": r["train/reward"],
                                   "accuracy": r["train/accuracy"],
                                   "offline_accept_rate": r.get("mtp/offline_accept_rate")} for r in rows]
                              for a, rows in arms.items()}}
    for a, rows in arms.items():
        out[f"mtp/final_accept_rate_{a}"] = rows[-1]["mtp/accept_rate"]
        out[f"mtp/final_accept_length_{a}"] = rows[-1]["mtp/accept_length"]
        out[f"mtp/final_reward_{a}"] = rows[-1]["train/reward"]
        out[f"mtp/final_accuracy_{a}"] = rows[-1]["train/accuracy"]
        tail = rows[-max(1, len(rows) // 4):]  # one eval is noisy (+-0.04 on 256 prompts): the last quarter's mean
        out[f"mtp/tail_accept_rate_{a}"] = sum(r["mtp/accept_rate"] for r in tail) / len(tail)
    first = arms[cfg.arms[0]][0]
    out["mtp/start_accept_rate"] = first["mtp/accept_rate"]
    out["mtp/start_reward"] = first["train/reward"]
    # Offline a vs measured depth-1 acceptance, pooled over every step of the arms whose engine draft is the
    # trainer's own (unsynced's engine draft is not what the trainer's forward sees).
    pooled = [r for a in cfg.arms if a != "unsynced" for r in arms[a] if r.get("mtp/offline_accept_rate") is not None]
    if pooled:
        off = sum(r["mtp/offline_accept_rate"] for r in pooled) / len(pooled)
        meas = sum(r["mtp/accept_rate_pos_1"] for r in pooled) / len(pooled)
        out["mtp/offline_accept_rate"], out["mtp/measured_accept_rate_pos_1"] = off, meas
        out["mtp/offline_vs_measured_rel_err"] = abs(off - meas) / max(meas, 1e-9)
    out["mtp/k"], out["mtp/steps"], out["mtp/spec_temperature"] = cfg.k, cfg.steps, cfg.spec_temperature
    return out


def run(cfg: ExperimentConfig | None = None, *, quick: bool = False, model_dir: str | None = None,
        progress: bool = True, task=None) -> dict:
    """All arms on one engine (`task`: a labkit.tasks.Task, default arithmetic); returns {"history": per-step
    rows, "metrics": summarize(...)}."""
    cfg = cfg or (ExperimentConfig.quick() if quick else ExperimentConfig())
    model_dir = model_dir or default_model_dir()
    n_mtp = int(read_config_json(model_dir).get("num_nextn_predict_layers", 0))  # fail before anything starts
    check(n_mtp >= 1, "model_dir", model_dir, "a model with an MTP layer (num_nextn_predict_layers >= 1) to draft with")
    t0 = time.perf_counter()
    runtime.init()
    placement = Placement(layout("colocated", 1, 1, cpus_per_bundle=2.0))
    engine = None
    try:
        engine = EngineHandle.start(EngineConfig(model_dir=model_dir, dtype="float32", max_total_tokens=8192,
                                                 mem_fraction_static=0.05),
                                    scheduling_strategy=placement.strategy("engine:0"))
        history = [r for arm in cfg.arms for r in run_arm(arm, engine, placement, model_dir, cfg, progress, task)]
    finally:
        if engine is not None:
            engine.shutdown()
        placement.remove()
    metrics = summarize(history, cfg)
    metrics["timing/mtp_experiment/total"] = round(time.perf_counter() - t0, 1)
    return {"history": history, "metrics": metrics}


def with_overrides(cfg: ExperimentConfig, **kw) -> ExperimentConfig:
    """CLI/notebook overrides: TrainConfig fields go to cfg.rl.train, RLConfig's to cfg.rl, the rest to cfg;
    None means keep."""
    kw = {k: v for k, v in kw.items() if v is not None}
    train = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__ and k != "seed"}
    rl_fields = {k: kw.pop(k) for k in list(kw) if k in RLConfig.__dataclass_fields__}
    return replace(cfg, **kw, rl=replace(cfg.rl, **rl_fields, train=replace(cfg.rl.train, **train)))
