"""Does the MTP draft keep up when RL moves the policy? Three arms that differ only by design, over seeds.

  frozen    the MTP layer is not trained (mtp_loss_scale 0); everything is synced, so the draft reads the
            current trunk states and the current shared embedding/output head through a step-0 MTP layer
  trained   MTP loss on the response tokens, trunk detached (labkit.trainer.mtp_loss); everything synced
  unsynced  trained like `trained`, but each sync leaves the draft layers out: the engine's draft store stays
            as at step 0, and acceptance uses the draft read back from the engine (get_weights_by_name). The
            embedding and output head are the target's, synced: SGLang's MTP worker shares them with the
            target (eagle_worker_v2 "Share the embedding and lm_head"), so a draft left out of a sync is the
            MTP layers alone (the vime #351 / miles #1926 failure)

What keeps the comparison clean: the arms of a seed share the trainer seed, RL prompts and per-request
sampling seeds (labkit.mtp.rl.sampling_params; on CPU through labkit.compat.seeded), and the MTP layers clip
their own gradients (TrainConfig.mtp_clip="own"), so the draft cannot move the policy: the trunks, and with
them the rollouts, stay identical across arms (mtp/rollouts_identical_*). Acceptance is measured on the task's
held-out problems, never drawn by pretraining or RL (mtp/eval_disjoint).

Every step: export -> acceptance measured by labkit's speculative loop (labkit.mtp.speculative) over the
exported weights the engine serves -> one RL step (labkit.mtp.rl), which rolls out from the engine, estimates
acceptance offline from its teacher-forced forward, trains and syncs. k defaults to 1, MiMo's own SGLang recipe
(1 step, top-k 1, 2 draft tokens), so the measured accept rate is the per-token acceptance `a` that the
offline estimate predicts. Across seeds: labkit.mtp.summary, labkit.mtp.stats.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from labkit.config import ParallelSpec, TrainConfig, check
from labkit.cluster.placement import PlacementSpec
from labkit.engine import EngineConfig
from labkit.engine.config import SpeculativeConfig
from labkit.engine.startup import place, start_each
from labkit.models.hf import read_config_json
from labkit.models.tiny import default_model_dir
from labkit.mtp import engine_accept, rl, summary, warmup
from labkit.mtp.cadence import Cadence
from labkit.mtp.engine_accept import draft_bytes, engine_draft, measure
from labkit.mtp.acceptance import expected_accept_length
from labkit.mtp.rl import RLConfig
from labkit.mtp.warmup import DRAFT_LAYERS
from labkit.sync import SyncConfig, sync
from labkit.tasks import TASKS, ArithTask

Arm = Literal["frozen", "trained", "unsynced"]
ARMS = get_args(Arm)
Spec = Literal["loop", "engine"]


@dataclass(kw_only=True, slots=True, frozen=True)
class ExperimentConfig:
    steps: int = 60
    """RL steps per arm."""
    arms: tuple[Arm, ...] = ARMS
    """The arms run per seed (the module's docstring says what each is)."""
    k: int = 1
    """Drafts per verify step, k (draft_len; 1 is MiMo's recipe; SGLang: speculative_num_steps, its
    num_draft_tokens is k + 1)."""
    spec_temperature: float = 1.0
    """Speculative sampling temperature: the rollout temperature, what RL serves."""
    eval_prompts: int = 256
    """Held-out problems the acceptance is measured on (the task's `evaluation(n)`: never trained on)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """One run of every arm per seed (trainer init, RL prompts, rollout sampling seeds, eval sampling)."""
    draft_sync_every: int = 1
    """Cadence: the trained arms' syncs carry the draft layers every N-th step only (1: every step); with N > 1
    acceptance uses the draft read back from the engine, stale between its syncs."""
    draft_sync_margin: float = 0.0
    """Acceptance-driven cadence (labkit.mtp.cadence): > 0 syncs the trained arms' draft only once the EMA of its
    measured acceptance has fallen this far below its value after the last draft sync (0: off)."""
    pre_rl_steps: int = 0
    """MTP-only steps on the initial policy's own rollouts before RL (labkit.mtp.warmup, Bebop): every arm's draft
    starts there, the trunk stays the checkpoint's. arms=("frozen",) with pre_rl_steps > 0 is the pre-RL-only
    cadence."""
    task: Literal["arith", "chain"] = "arith"
    """The task (labkit.tasks.TASKS): "arith", 3-token sums; "chain", 134-character worked Fibonacci chains, the long
    answers whose acceptance by position (`mtp/accept_rate_at_{lo}_{hi}`, bins of 32 tokens) means something. Its
    checkpoint is the default model (data/tiny-mimo, data/tiny-mimo-chain) and rl.max_new_tokens must cover its
    answers (`with_overrides` sets it)."""
    spec: Spec = "loop"
    """Where acceptance is measured: "loop", labkit's speculative loop over the exported weights
    (labkit.mtp.speculative); "engine", SGLang's own speculative decoding in a second engine synced like the rollout
    engine, read off its counters (labkit.mtp.engine_accept), the loop beside it as the cross-check."""
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
        check(isinstance(self.seeds, tuple) and bool(self.seeds) and len(set(self.seeds)) == len(self.seeds)
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in self.seeds),
              "seeds", self.seeds, "a non-empty tuple of distinct integers >= 0")
        self.cadence()  # draft_sync_every and draft_sync_margin, checked where they are used
        check(isinstance(self.pre_rl_steps, int) and not isinstance(self.pre_rl_steps, bool)
              and self.pre_rl_steps >= 0, "pre_rl_steps", self.pre_rl_steps, "an integer >= 0")
        check(self.pre_rl_steps == 0 or self.rl.train.mtp_loss_scale > 0, "pre_rl_steps", self.pre_rl_steps,
              "0 when mtp_loss_scale is 0 (nothing would train the draft)")
        check(self.spec in get_args(Spec), "spec", self.spec, f"one of {get_args(Spec)}")
        check(self.task in TASKS, "task", self.task, f"one of {', '.join(TASKS)}")
        budget = TASKS[self.task]().max_new_tokens
        check(self.rl.max_new_tokens >= budget, "max_new_tokens", self.rl.max_new_tokens,
              f">= {budget}, the {self.task} task's answer budget (with_overrides(task=...) sets it)")

    def cadence(self) -> Cadence:
        return Cadence(every=self.draft_sync_every, margin=self.draft_sync_margin)

    @classmethod
    def quick(cls, **kw) -> ExperimentConfig:
        """Seconds per step, for tests and smoke runs: the numbers mean little."""
        return cls(**{"steps": 2, "eval_prompts": 16, "seeds": (0,), "rl": RLConfig(prompts=4, group=4), **kw})


def speculate(model_dir: str | None = None, *, k: int = 2, temperature: float = 1.0, prompts: int = 256,
              seed: int = 0, task: str = "arith") -> dict:
    """Speculative decoding with a checkpoint's own MTP draft on held-out prompts, no RL: SGLang-named counters
    (accept length, per-position rates) and the accept length theory predicts from the depth-1 rate. `task`: a
    name in labkit.tasks.TASKS (its checkpoint is the default model, its answer budget the token budget)."""
    from labkit.mtp.speculative import Speculator  # torch; the CLI imports this module for its config

    check(task in TASKS, "task", task, f"one of {', '.join(TASKS)}")
    model_dir, task_obj = model_dir or default_model_dir(task), TASKS[task]()
    problems = evaluation_set(task_obj, min(prompts, task_obj.evaluation_size()))[0]
    ids = [task_obj.tokenizer.encode(p.prompt) for p in problems]
    out = Speculator(model_dir).generate(ids, k=k, temperature=temperature, max_new_tokens=task_obj.max_new_tokens,
                                         seed=seed)
    m = dict(out["metrics"])
    m["mtp/theory_accept_length"] = expected_accept_length(m["mtp/accept_rate_pos_1"], k)
    m["mtp/k"], m["mtp/spec_temperature"] = k, temperature
    return {"metrics": m, "requests": out["requests"]}


def evaluation_set(task, n: int) -> tuple[list, bool]:
    """(problems, held_out): the task's held-out problems when it has them (`evaluation(n)`), else a seeded
    draw that may overlap training (held_out False, and `mtp/eval_disjoint` says so)."""
    if hasattr(task, "evaluation"):
        return list(task.evaluation(n)), True
    return list(task.problems(n, seed=999_983)), False


def checkpoint_held_out(model_dir: str, task) -> bool:
    """Whether the checkpoint's pretraining record (pretrain.json) names this task's held-out set as excluded."""
    record = Path(model_dir) / "pretrain.json"
    if not (hasattr(task, "evaluation_digest") and record.is_file()):
        return False
    return json.loads(record.read_text()).get("pretrain/held_out_digest") == task.evaluation_digest()


def run_arm(arm: str, engine, placement, model_dir: str, cfg: ExperimentConfig, seed: int, progress: bool = True,
            task=None, spec_engine=None) -> list[dict]:
    from tqdm.auto import tqdm

    from labkit.trainer.group import Trainer  # crosses Ray and Megatron: the CLI imports this module for its config

    task = task or ArithTask()
    scale = 0.0 if arm == "frozen" else cfg.rl.train.mtp_loss_scale
    trainer = Trainer(model_dir, ParallelSpec(), replace(cfg.rl.train, mtp_loss_scale=scale, seed=1234 + seed),
                      placement=placement)
    rows = []
    try:
        s0 = sync(trainer, engine, SyncConfig(progress=False), weight_version=f"{arm}-{seed}-0")  # arms start equal
        check(s0.get("sync/verified") is not False, "sync", s0.get("sync/verified"), "a verified initial sync")
        eval_problems, _ = evaluation_set(task, cfg.eval_prompts)
        held = {p.prompt for p in eval_problems}
        eval_ids = [task.tokenizer.encode(p.prompt) for p in eval_problems]
        cadence = cfg.cadence()
        read_back = arm == "unsynced" or cadence.stale_between  # the engine's draft may not be the trainer's
        bar = tqdm(range(cfg.steps + 1), desc=f"seed {seed} arm {arm}", disable=not progress)
        synced = ()  # what the rollout engine's last sync left out (the initial one: nothing)
        for step in bar:
            t0 = time.perf_counter()
            named = dict(trainer.export())
            draft = engine_draft(engine, named) if read_back else None
            if spec_engine is None:
                acc = measure(model_dir, named, draft, eval_ids, cfg, seed=seed * 7919 + step)
            else:
                acc = engine_accept.measure_step(spec_engine, trainer, model_dir, named, eval_ids, cfg,
                                                 seed * 7919 + step, synced, f"{arm}-{seed}-{step}")
                if step == cfg.steps:
                    acc.update(engine_accept.speedup(spec_engine, engine, eval_ids, cfg.rl.max_new_tokens))
            skip = arm == "unsynced" or not cadence.carries(step, acc["mtp/accept_rate"])
            exclude = DRAFT_LAYERS if skip else ()
            acc["mtp/draft_sync_bytes"] = 0 if skip or step == cfg.steps else draft_bytes(named)  # last: no sync
            synced = exclude
            problems = task.problems(cfg.rl.prompts, seed=seed * 1_000_003 + 17 * (step + 1))
            m = rl.step(trainer, engine, problems, cfg.rl, step_index=step, eval_problems=eval_problems[:64],
                        train=step < cfg.steps, exclude=exclude, spec_temperature=cfg.spec_temperature,
                        spec_k=cfg.k, task=task, seed=(seed, step))
            if draft is not None:  # does the engine's draft equal the trainer's? (unsynced: only at step 0)
                acc["mtp/engine_draft_is_trainers"] = all(t.equal(named[n]) for n, t in draft.items())
            rows.append({"arm": arm, "seed": seed, "step": step, **acc, **m,
                         "rl/eval_overlap": sum(p.prompt in held for p in problems),
                         "timing/step": round(time.perf_counter() - t0, 2)})
            bar.set_postfix(reward=f"{m['train/reward']:.2f}", accept=f"{acc['mtp/accept_rate']:.2f}")
    finally:
        trainer.shutdown()
    return rows


def run_seed(seed: int, engine, placement, model_dir: str, cfg: ExperimentConfig, task, progress: bool = True,
             spec_engine=None) -> tuple[list[dict], dict | None]:
    """Every arm of one seed: (rows, the pre-RL draft phase's record or None). With `cfg.pre_rl_steps` the arms
    start from the checkpoint the phase writes (a temporary copy: same trunk, pre-trained draft)."""
    with tempfile.TemporaryDirectory(prefix="labkit-pre-rl-") as tmp:
        pre, start = None, model_dir
        if cfg.pre_rl_steps:
            held = {p.prompt for p in evaluation_set(task, cfg.eval_prompts)[0]}
            pre = warmup.pretrain_draft(model_dir, engine, placement, cfg, seed, task, held, tmp, progress)
            start = pre["model_dir"]
        rows = [r for arm in cfg.arms
                for r in run_arm(arm, engine, placement, start, cfg, seed, progress, task, spec_engine)]
    return rows, pre


def run(cfg: ExperimentConfig | None = None, *, quick: bool = False, model_dir: str | None = None,
        progress: bool = True, task=None) -> dict:
    """Every seed x arm on one engine (`task`: a labkit.tasks.Task, default arithmetic); returns {"history":
    per-step rows, "metrics": summary.summarize(...)}."""
    cfg = cfg or (ExperimentConfig.quick() if quick else ExperimentConfig())
    model_dir = model_dir or default_model_dir(cfg.task)
    task = task or TASKS[cfg.task]()
    n_mtp = int(read_config_json(model_dir).get("num_nextn_predict_layers", 0))  # fail before anything starts
    check(n_mtp >= 1, "model_dir", model_dir, "a model with an MTP layer (num_nextn_predict_layers >= 1) to draft with")
    _, held_out = evaluation_set(task, cfg.eval_prompts)  # a bad eval_prompts fails here, before anything starts
    t0 = time.perf_counter()
    speculative = cfg.spec == "engine"
    placement = place(PlacementSpec(mode="colocated", engines=2 if speculative else 1), 1)
    engines: list = []
    try:
        plain = EngineConfig(model_dir=model_dir, dtype="float32", max_total_tokens=8192, mem_fraction_static=0.05)
        # with --spec engine, beside it the same engine with SGLang's speculative decoding, its MTP layer the draft
        spec_cfg = replace(plain, speculative=SpeculativeConfig(num_steps=cfg.k, num_draft_tokens=cfg.k + 1))
        engine, spec_engine = (start_each([plain, spec_cfg] if speculative else [plain], placement, engines)
                               + [None])[:2]
        runs = [run_seed(seed, engine, placement, model_dir, cfg, task, progress, spec_engine) for seed in cfg.seeds]
    finally:
        for e in engines:
            e.shutdown()
        placement.remove()
    history = [r for rows, _ in runs for r in rows]
    pre_rl = [p for _, p in runs if p is not None]
    metrics = summary.summarize(history, cfg.arms, cfg.seeds,
                                eval_held_out=held_out and checkpoint_held_out(model_dir, task))
    metrics.update(summary.pre_rl(pre_rl, cfg.pre_rl_steps))
    metrics["mtp/eval_disjoint"] = metrics["mtp/eval_disjoint"] and not metrics.get("mtp/pre_rl_eval_overlap")
    metrics.update({"mtp/k": cfg.k, "mtp/steps": cfg.steps, "mtp/spec_temperature": cfg.spec_temperature,
                    "mtp/spec": cfg.spec, "mtp/task": cfg.task, "mtp/max_new_tokens": cfg.rl.max_new_tokens,
                    "mtp/target": cfg.rl.train.mtp_target, "mtp/draft_sync_every": cfg.draft_sync_every,
                    "mtp/draft_sync_margin": cfg.draft_sync_margin,
                    "timing/mtp_experiment/total": round(time.perf_counter() - t0, 1)})
    return {"history": history, "metrics": metrics}


def with_overrides(cfg: ExperimentConfig, **kw) -> ExperimentConfig:
    """CLI/notebook overrides: TrainConfig fields go to cfg.rl.train, RLConfig's to cfg.rl, the rest to cfg;
    None means keep."""
    kw = {k: v for k, v in kw.items() if v is not None}
    if kw.get("task", cfg.task) != cfg.task and "max_new_tokens" not in kw:  # the new task's answers must fit
        kw["max_new_tokens"] = TASKS[kw["task"]]().max_new_tokens
    train = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__ and k != "seed"}
    rl_fields = {k: kw.pop(k) for k in list(kw) if k in RLConfig.__dataclass_fields__}
    return replace(cfg, **kw, rl=replace(cfg.rl, **rl_fields, train=replace(cfg.rl.train, **train)))
