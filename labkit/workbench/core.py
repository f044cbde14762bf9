"""The walking skeleton as one object: a Megatron trainer and an SGLang engine on Ray, and the calls that
move weights between them and check the result. Notebooks, the CLI and tests use it one call at a time.

>>> wb = Workbench()                       # data/tiny-mimo, TP=1, colocated, a real CPU SGLang engine
>>> wb.train(3); m = wb.sync(SyncConfig(transport="colocated")); m["sync/verified"]
True
>>> wb.compare_greedy()["rollout/greedy_match"]
True
"""

from __future__ import annotations

import time
from dataclasses import replace

from labkit.config import ParallelSpec, TrainConfig
from labkit.models.tiny import default_model_dir
from labkit.sync.config import SyncConfig


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


class Workbench:
    def __init__(self, model_dir: str | None = None, parallel: ParallelSpec | None = None,
                 train: TrainConfig | None = None, engine=None, placement: str = "colocated",
                 engine_url: str | None = None):
        from labkit.cluster import runtime
        from labkit.cluster.placement import Placement, layout
        from labkit.engine import EngineConfig, EngineHandle
        from labkit.trainer.group import Trainer

        t0 = time.perf_counter()
        self.model_dir = model_dir or default_model_dir()
        self.parallel = parallel or ParallelSpec()
        runtime.init()
        # Colocated: a trainer rank and the engine share a bundle (2 logical CPUs: one actor each).
        cpus = 2.0 if placement == "colocated" else 1.0
        self.placement = Placement(layout(placement, self.parallel.world_size, 1, cpus_per_bundle=cpus))
        self.trainer = Trainer(self.model_dir, self.parallel, train or TrainConfig(), placement=self.placement)
        cfg = engine or EngineConfig(model_dir=self.model_dir, dtype="float32", max_total_tokens=4096,
                                     mem_fraction_static=0.05)
        if engine_url:
            cfg = replace(cfg, url=engine_url)
        self.engine = EngineHandle.start(cfg, scheduling_strategy=None if engine_url else
                                         self.placement.strategy("engine:0"))
        self.steps = 0
        self.timings = {"timing/startup": round(time.perf_counter() - t0, 2)}

    def train(self, steps: int, batch_size: int = 16, progress: bool = True) -> list[dict]:
        """Supervised steps on the arithmetic task, so the trainer's weights move away from the engine's."""
        hist = train(self.trainer, steps, batch_size=batch_size, seed=1 + self.steps, progress=progress)
        self.steps += steps
        return hist

    def sync(self, cfg: SyncConfig | None = None, weight_version: str | None = None) -> dict:
        from labkit.sync import sync

        return sync(self.trainer, self.engine, cfg or SyncConfig(), weight_version)

    def compare_greedy(self, n_prompts: int = 8, max_new_tokens: int = 6, seed: int = 123) -> dict:
        """Greedy continuations from the engine vs the trainer's own Megatron forward, token for token."""
        from labkit.models.tokenizer import EOS, decode, encode
        from labkit.tasks import arith

        problems = arith.problems(n_prompts, seed=seed)
        ids = [encode(p.prompt) for p in problems]
        outs = self.engine.generate(input_ids=ids, sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens})
        engine_tokens = [o["tokens"] for o in outs]
        trainer_tokens = self.trainer.greedy(ids, max_new_tokens, EOS)
        match = [a == b for a, b in zip(engine_tokens, trainer_tokens)]
        return {"rollout/greedy_match": all(match), "rollout/greedy_match_frac": sum(match) / len(match),
                "rollout/weight_version": outs[0]["meta_info"].get("weight_version"),
                "rollout/samples": [{"prompt": p.prompt, "engine": decode(a), "trainer": decode(b)}
                                    for p, a, b in zip(problems, engine_tokens, trainer_tokens)]}

    def close(self) -> None:
        """Stop the engine (its shutdown also drops the last-good host copy, `Guard.close`), the trainer (which
        frees its shared-memory sync buffers before its actors die) and the placement. Every part is closed
        even if an earlier one raises, so nothing a run mapped outlives it (/dev/shm is RAM). Idempotent."""
        errors = []
        for obj in ("engine", "trainer"):
            x = getattr(self, obj, None)
            if x is not None:
                setattr(self, obj, None)
                try:
                    x.shutdown()
                except Exception as e:  # go on: the other parts still hold memory and processes
                    errors.append(e)
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
