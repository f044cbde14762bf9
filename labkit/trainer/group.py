"""The trainer as a group of Ray actors, one per Megatron rank (TP x PP)."""

from __future__ import annotations

import os

from labkit.cluster import runtime
from labkit.config import ParallelSpec, TrainConfig


class Trainer:
    """Driver-side handle: every call fans out to all ranks and returns the output rank's result.

    >>> t = Trainer("data/tiny", ParallelSpec(tp=2))
    >>> t.train_step(tokens, loss_mask)["train/loss"]
    """

    def __init__(self, model_dir: str, parallel: ParallelSpec | None = None, train: TrainConfig | None = None,
                 *, placement=None):
        import ray

        from labkit.models.hf import check_parallel, read_config_json
        from labkit.trainer.rank import TrainerRank

        self.parallel, self.train_cfg = parallel or ParallelSpec(), train or TrainConfig()
        # Fail on a bad directory or layout before any process starts.
        check_parallel(read_config_json(model_dir), self.parallel.tp, self.parallel.pp)
        runtime.init()
        world = self.parallel.world_size
        threads = max(1, (os.cpu_count() or 1) // world)
        gpu = 1 if ray.cluster_resources().get("GPU", 0) >= world else 0
        actor = ray.remote(TrainerRank)
        self.actors = []
        for r in range(world):
            opts = {"num_cpus": 1, "num_gpus": gpu}
            if placement is not None:
                opts["scheduling_strategy"] = placement.strategy(f"trainer:{r}")
            self.actors.append(actor.options(**opts).remote(parallel=self.parallel, train=self.train_cfg,
                                                             threads=threads))
        addr, port = ray.get(self.actors[0].address.remote())
        self.compat = self._all("setup", _per_rank=lambda r: (r, world, addr, port))[0]
        self.info = self._all("load", model_dir)
        self.model_dir = model_dir

    def _all(self, method: str, *args, _per_rank=None, **kwargs) -> list:
        import ray

        refs = [getattr(a, method).remote(*(_per_rank(r) if _per_rank else args), **kwargs)
                for r, a in enumerate(self.actors)]
        return ray.get(refs)

    def _one(self, method: str, *args, **kwargs):
        return next(x for x in self._all(method, *args, **kwargs) if x is not None)

    def train_step(self, tokens, loss_mask, weights=None, mtp_only: bool = False) -> dict:
        return self._one("train_step", tokens, loss_mask, weights, mtp_only)

    def set_lr(self, lr: float) -> None:
        self._all("set_lr", lr)

    def forward(self, tokens) -> dict:
        return self._one("forward", tokens)

    def sync(self, engine, cfg, engine_spec: dict | None = None, weight_version: str | None = None,
             exclude: tuple[str, ...] = ()) -> dict:
        return self._one("sync", engine, cfg, engine_spec, weight_version, exclude=tuple(exclude))

    def greedy(self, input_ids: list[list[int]], max_new_tokens: int, eos_id: int | None = None) -> list[list[int]]:
        """Greedy continuation with the trainer's own Megatron forward (the reference the engine must match)."""
        import torch

        outs = []
        for ids in input_ids:
            seq, new = list(ids), []
            for _ in range(max_new_tokens):
                logits = self.forward(torch.tensor([seq]))["logits"][0, -1]
                nxt = int(torch.argmax(logits))
                new.append(nxt)
                seq.append(nxt)
                if nxt == eos_id:
                    break
            outs.append(new)
        return outs

    def export(self, fast: bool = True) -> list:
        return self._one("export", fast=fast)

    @property
    def num_params(self) -> int:
        return sum(i["params"] for i in self.info)

    def shutdown(self, release_timeout_s: float = 30.0) -> list[str]:
        """Stop every rank and leave no memory behind them. Idempotent. Returns the /dev/shm files removed.

        Each rank first frees its sync buffers itself (`TrainerRank.release`, bounded by `release_timeout_s`:
        a hung or dead rank is killed anyway): a SIGKILLed process never unlinks its shared-memory files, and
        they held a model's worth of RAM after the command had exited. Then the actors are killed and, once
        they are gone, the driver removes whatever of theirs is left and held by no live process.
        """
        import ray

        from labkit.compat import sglang as compat

        actors, self.actors = self.actors, []
        if not actors:
            return []
        refs = [a.release.remote() for a in actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=release_timeout_s)
        except Exception:
            pass
        for a in actors:
            ray.kill(a, no_restart=True)
        runtime.wait_dead(actors)
        return compat.cleanup_shm()

