"""The walking skeleton as one object: a Megatron trainer and an SGLang engine on Ray, and the calls that
move weights between them and check the result. Notebooks, the CLI, tests and scripts use it one call at a time.

The task (problems, reward, supervised batches, tokenizer) is injected, default the arithmetic task; calls
that generate return data apart from metrics (`Rollout`: `samples` for tables, `metrics` scalars to log).

>>> wb = Workbench()                       # data/tiny-mimo, TP=1, colocated, a real CPU SGLang engine
>>> wb.train(3); m = wb.sync(SyncConfig(transport="colocated")); m["sync/verified"]
True
>>> wb.compare_greedy().metrics["rollout/greedy_match"]
True
>>> r = wb.rollout(n=8, temperature=1.0); r.metrics["rollout/n"], len(r.samples)
(8, 8)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from labkit.cluster import runtime
from labkit.cluster.placement import PlacementSpec
from labkit.config import ParallelSpec, TrainConfig, check
from labkit.engine import EngineConfig
from labkit.engine.startup import place, start_beside
from labkit.models.families import model_dir_for
from labkit.models.fp8 import master_dir
from labkit.models.hf import read_config_json
from labkit.mtp.rollout import rollout as rollout_rows
from labkit.sync import sync
from labkit.sync.config import SyncConfig
from labkit.tasks import ArithTask, Task, check_task
from labkit.trainer.group import Trainer


@dataclass(frozen=True, slots=True)
class Rollout:
    """What a generating call returns, data apart from metrics: `samples` (one dict per completion: prompt,
    completion, reward, weight_version, token ids, ...) for tables and the next step; `metrics` holds only
    scalars under stable keys, so it can be logged or json-dumped as is."""

    samples: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


# Supervised steps from the shipped checkpoint, which is converged (its post-training ended at lr 5e-5). A fresh
# Adam moves every weight by ~lr in its first steps whatever the gradient, so a large lr (TrainConfig's 1e-3)
# raises the loss of a converged model; at 1e-4, with the draft's gradient kept off the trunk as in RL, it goes
# down (`make demo` checks it on a fixed evaluation batch).
FINETUNE = TrainConfig(lr=1e-4, mtp_detach=True)
EVAL_SEED = 2_000_000_011  # training batches draw seed (1 + steps done) * 100_003 + step, far below this


def eval_loss(trainer, task: Task, n: int = 256, seed: int = EVAL_SEED) -> float:
    """train/loss's quantity (next-token cross-entropy on the task's masked tokens, over the trainer's full
    logits) on a fixed batch of `n` problems drawn with a seed no training batch uses, without an update.
    train/loss is one 16-problem batch per step, too noisy to say whether training helped; this is the number to
    compare before and after. Not a held-out split: the arithmetic task has only 2,500 problems, so some of these
    were trained on; it measures what the steps did to the model, not generalization."""
    tokens, mask = task.batch(task.problems(n, seed=seed))
    logits = trainer.forward(tokens)["logits"].float()
    labels = torch.roll(tokens.long(), -1, dims=1)
    target = torch.roll(mask.float(), -1, dims=1)  # the mask marks target tokens; the predictor is one to the left
    target[:, -1] = 0.0
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(target)
    return float((ce * target).sum() / target.sum().clamp(min=1.0))


def train(trainer, steps: int, batch_size: int = 16, seed: int = 0, progress: bool = True,
          task: Task | None = None) -> list[dict]:
    """Supervised steps on the task's batches (default: arithmetic, answer tokens only). Per-step metrics."""
    task = task or ArithTask()
    history = []
    bar = tqdm(range(steps), desc="train", disable=not progress, mininterval=1.0)
    for step in bar:
        tokens, mask = task.batch(task.problems(batch_size, seed=seed * 100_003 + step))
        m = trainer.train_step(tokens, mask)
        history.append({"step": step, **m})
        bar.set_postfix(loss=f"{m['train/loss']:.3f}", mtp=f"{m['mtp/loss']:.3f}")
    return history


def rollout(engine, task: Task, n: int = 8, *, seed: int = 0, temperature: float = 1.0,
            max_new_tokens: int | None = None) -> Rollout:
    """Sample one completion per task prompt from the engine, with its log-probs, scored by the task's reward
    (labkit.mtp.rollout, where a rollout is written once).

    Samples: problem, prompt, completion, reward, weight_version, prompt_ids, tokens, logprobs.
    Metrics: rollout/n, rollout/reward_mean, rollout/weight_version, rollout/temperature.
    """
    check(isinstance(n, int) and not isinstance(n, bool) and n >= 1, "n", n, "an integer >= 1")
    check(isinstance(temperature, (int, float)) and temperature >= 0, "temperature", temperature,
          ">= 0 (0 is greedy)")
    samples = rollout_rows(engine, task, task.problems(n, seed=seed), {
        "temperature": temperature, "max_new_tokens": max_new_tokens or task.max_new_tokens})
    return Rollout(samples, {"rollout/n": len(samples),
                             "rollout/reward_mean": sum(s["reward"] for s in samples) / len(samples),
                             "rollout/weight_version": samples[0]["weight_version"],
                             "rollout/temperature": float(temperature)})


def default_engine(model_dir: str | None, **changes) -> EngineConfig:
    """The engine a Workbench starts unless given one: float32 so syncs compare bitwise; an FP8 checkpoint serves
    with bf16 activations (its weights still compare bitwise). `model_dir` as Workbench takes it (None, a preset
    name, a path); `changes`: EngineConfig fields (e.g. tp)."""
    model_dir = model_dir_for(model_dir)
    quantized = master_dir(model_dir)[1]
    return EngineConfig(**{"model_dir": model_dir, "dtype": "bfloat16" if quantized else "float32",
                           "max_total_tokens": 4096, "mem_fraction_static": 0.05, **changes})


class Workbench:
    def __init__(self, model_dir: str | None = None, parallel: ParallelSpec | None = None, *,
                 train_cfg: TrainConfig | None = None, engine_cfg=None, task: Task | None = None,
                 placement: str | PlacementSpec = "colocated", engine_url: str | None = None,
                 progress: bool = True):
        """`train_cfg` configures the trainer (default FINETUNE; `wb.train` is the method that trains),
        `placement` where trainer and engine run (a mode, or a PlacementSpec pinning each to nodes),
        `engine_cfg` the engine (`wb.engine` is the running handle); `task` supplies problems, reward and
        batches (default arithmetic). `progress`: a bar naming the part starting (a minute on 2 cores)."""
        self.task = task if task is not None else ArithTask()
        check_task(self.task)  # a wrong task object fails here, before Ray, the trainer or the engine start
        if engine_url and isinstance(placement, PlacementSpec) and placement.engines != 1:
            raise ValueError(f"engines={placement.engines} is invalid with engine_url: a URL names one engine")

        t0 = time.perf_counter()
        self.model_dir = model_dir_for(model_dir)  # None: the shipped tiny MiMo; a family name: its preset
        read_config_json(self.model_dir)  # a model type or family variant labkit cannot run fails before Ray starts
        self.parallel = parallel or ParallelSpec()
        self.placement = self.trainer = self.engine = self.replicas = None
        self.engines: list = []
        try:
            self._start(train_cfg or FINETUNE, engine_cfg, placement, engine_url, progress)
        except BaseException:  # a half-built workbench must not leave its trainer or placement group running
            try:
                self.close()
            except Exception:  # the start's own error is the one to see
                pass
            raise
        self.steps = 0
        self.timings = {"timing/startup": round(time.perf_counter() - t0, 2)}

    def _start(self, train_cfg: TrainConfig, engine_cfg, placement: str | PlacementSpec, engine_url: str | None,
               progress: bool) -> None:
        spec = placement if isinstance(placement, PlacementSpec) else PlacementSpec(mode=placement)
        bar = tqdm(total=3, desc="start", unit="part", disable=not progress, postfix="ray",
                   bar_format="{desc}: {n}/{total} [{elapsed}{postfix}]")
        gpus = runtime.init()["gpus"]
        bar.update()
        bar.set_postfix_str("trainer + engine")
        self.placement = place(spec, self.parallel.world_size)
        trainer_dir, _ = master_dir(self.model_dir)  # an FP8 engine: the trainer holds the bf16 original
        cfg = engine_cfg or default_engine(self.model_dir)
        if engine_url:
            cfg = replace(cfg, url=engine_url)

        def start_trainer():
            self.trainer = Trainer(trainer_dir, self.parallel, train_cfg, placement=self.placement)
            bar.update()

        # Side by side unless they share a GPU; every engine that started is kept, so that close() stops it even
        # when the trainer or another engine failed.
        shared_gpu = spec.mode == "colocated" and gpus > 0 and not engine_url
        start_beside(start_trainer, cfg, self.placement, spec.engines, self.engines, overlap=not shared_gpu)
        self.engine = self.engines[0]
        if spec.engines > 1:  # synced together: one broadcast, each verified, a failed one fenced
            from labkit.sync.fanout import Replicas  # crosses torch (the guard's host copy)

            self.replicas = Replicas(self.engines)
        bar.update()
        bar.set_postfix_str("ready")
        bar.close()

    def train(self, steps: int, batch_size: int = 16, progress: bool = True) -> list[dict]:
        """Supervised steps on the task's batches, so the trainer's weights move away from the engine's."""
        hist = train(self.trainer, steps, batch_size=batch_size, seed=1 + self.steps, progress=progress,
                     task=self.task)
        self.steps += steps
        return hist

    def eval_loss(self, n: int = 256, seed: int = EVAL_SEED) -> float:
        """The trainer's loss on a fixed evaluation batch of the task (see module-level `eval_loss`)."""
        return eval_loss(self.trainer, self.task, n, seed)

    def sync(self, cfg: SyncConfig | None = None, weight_version: str | None = None,
             exclude: tuple[str, ...] = ()) -> dict:
        """labkit.sync.sync into this engine; `exclude` leaves out tensors whose names contain any of the given
        substrings (they keep their weights and are listed in `sync/unverified`). Several engines
        (`PlacementSpec.engines`): one version into all of them (labkit.sync.fanout.Replicas)."""
        if self.replicas is not None:
            if exclude:
                raise ValueError(f"exclude={exclude!r}: several engines take whole versions only")
            return self.replicas.sync(self.trainer, cfg or SyncConfig(), weight_version)
        return sync(self.trainer, self.engine, cfg or SyncConfig(), weight_version, exclude=exclude)

    def rollout(self, n: int = 8, temperature: float = 1.0, seed: int = 0,
                max_new_tokens: int | None = None) -> Rollout:
        """Completions from the engine for `n` task prompts, scored by the task (see module-level `rollout`)."""
        return rollout(self.engine, self.task, n, seed=seed, temperature=temperature, max_new_tokens=max_new_tokens)

    def compare_greedy(self, n_prompts: int = 8, max_new_tokens: int = 6, seed: int = 123) -> Rollout:
        """Greedy continuations from the engine vs the trainer's own Megatron forward, token for token.

        Samples: prompt, engine, trainer (texts). Metrics: rollout/greedy_match, rollout/greedy_match_frac,
        rollout/weight_version."""
        tok = self.task.tokenizer
        problems = self.task.problems(n_prompts, seed=seed)
        ids = [tok.encode(p.prompt) for p in problems]
        outs = self.engine.generate(input_ids=ids, sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens})
        engine_tokens = [o["tokens"] for o in outs]
        trainer_tokens = self.trainer.greedy(ids, max_new_tokens, tok.eos_token_id)
        match = [a == b for a, b in zip(engine_tokens, trainer_tokens)]
        return Rollout([{"prompt": p.prompt, "engine": tok.decode(a), "trainer": tok.decode(b)}
                        for p, a, b in zip(problems, engine_tokens, trainer_tokens)],
                       {"rollout/greedy_match": all(match), "rollout/greedy_match_frac": sum(match) / len(match),
                        "rollout/weight_version": outs[0]["meta_info"].get("weight_version")})

    def close(self) -> None:
        """Stop the engines (each shutdown also drops its last-good host copy, `Guard.close`), the trainer (which
        frees its shared-memory sync buffers before its actors die) and the placement. Every part is closed
        even if an earlier one raises, so nothing a run mapped outlives it (/dev/shm is RAM). Idempotent."""
        errors = []
        if getattr(self, "replicas", None) is not None:
            self.replicas.close()
            self.replicas = None
        engines, one = list(getattr(self, "engines", None) or []), getattr(self, "engine", None)
        parts = engines + ([one] if one is not None and all(one is not e for e in engines) else [])
        self.engine, self.engines = None, []
        for x in [*parts, getattr(self, "trainer", None)]:
            if x is not None:
                try:
                    x.shutdown()
                except Exception as e:  # go on: the other parts still hold memory and processes
                    errors.append(e)
        self.trainer = None
        if getattr(self, "placement", None) is not None:
            self.placement.remove()
            self.placement = None
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
