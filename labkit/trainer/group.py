"""The trainer as a group of Ray actors, one per Megatron rank (TP x PP)."""

from __future__ import annotations

import os

from labkit.cluster import runtime
from labkit.compat import sglang as compat_sglang
from labkit.config import ParallelSpec, TrainConfig
from labkit.models.hf import check_parallel, num_experts, read_config_json
from labkit.trainer.rank import TrainerRank


class TrainerDied(RuntimeError):
    """A trainer actor died during a call (or was fenced): the Trainer is unusable, start a new one."""


class TrainerTimeout(TrainerDied):
    """The trainer missed a deadline and was killed (fenced) so that nothing late from it reaches the engine."""


class Trainer:
    """Driver-side handle: every call fans out to all ranks and returns the output rank's result.

    >>> t = Trainer("data/tiny", ParallelSpec(tp=2))
    >>> t.train_step(tokens, loss_mask)["train/loss"]
    """

    def __init__(self, model_dir: str, parallel: ParallelSpec | None = None, train: TrainConfig | None = None,
                 *, placement=None):
        import ray

        self.parallel, self.train_cfg = parallel or ParallelSpec(), train or TrainConfig()
        # Fail on a bad directory or layout before any process starts.
        check_parallel(read_config_json(model_dir), self.parallel.tp, self.parallel.pp, self.parallel.ep)
        runtime.init()
        world = self.parallel.world_size
        threads = max(1, (os.cpu_count() or 1) // world)
        gpu = 1 if ray.cluster_resources().get("GPU", 0) >= world else 0
        _check_moe_tp(read_config_json(model_dir), self.parallel, gpu)
        actor = ray.remote(TrainerRank)
        self.actors = []
        for r in range(world):
            opts = {"num_cpus": 1, "num_gpus": gpu, **runtime.ACTOR_OPTIONS}
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

    def export_to(self, consumer, engine, cfg, engine_spec: dict | None = None, weight_version: str | None = None,
                  exclude: tuple[str, ...] = (), deadline_s: float | None = None) -> dict:
        """Feed the trainer's export to `consumer` (the sync layer's `Syncer`, or any picklable object with the
        same `run`): `consumer.run(named_iter, engine, cfg, engine_spec, weight_version, exclude)` on rank 0
        while every rank drives the collective export (`TrainerRank.export_to`). Returns rank 0's metrics.
        The trainer is a producer (labkit.sync.producer.Producer, implemented here without importing it); the
        consumer moves the weights into the engine.

        `deadline_s`: the whole call. A trainer still busy then, or interrupted (Ctrl-C) while it runs, is
        killed (`fence`) and TrainerTimeout raised: a late bucket from it could otherwise land inside the
        engine's restore or the next sync. None waits for the ranks as any other call does (the consumer
        bounds each engine call itself). A rank that dies raises TrainerDied; an error inside a rank is raised
        as itself.
        """
        import ray

        kw = {"exclude": tuple(exclude)} if exclude else {}
        refs = [a.export_to.remote(consumer, engine, cfg, engine_spec, weight_version, **kw) for a in self.actors]
        try:
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=deadline_s)
        except BaseException:  # Ctrl-C in a notebook: the trainer would go on pushing buckets into the restore
            self.fence()
            raise
        if pending:
            self.fence()
            raise TrainerTimeout(f"the trainer did not finish the sync within deadline_s={deadline_s:g} s; "
                                 "killed it so that no late bucket can reach the engine")
        try:
            results = ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise TrainerDied(f"a trainer actor died during the sync ({error_line(e)})") from None
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
        return next(r for r in results if r is not None)

    def fence(self) -> None:
        """Kill every rank now, without letting them finish (no late write may reach the engine).
        `actors` stays as it was, so callers can still ask whether they are alive; `shutdown` cleans up."""
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)

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

    def shutdown(self, release_timeout_s: float = 30.0) -> list[str]:
        """Stop every rank and leave no memory behind them. Idempotent. Returns the /dev/shm files removed.

        Each rank first frees its sync buffers itself (`TrainerRank.release`, bounded by `release_timeout_s`:
        a hung or dead rank is killed anyway): a SIGKILLed process never unlinks its shared-memory files, and
        they held a model's worth of RAM after the command had exited. Then the actors are killed and, once
        they are gone, the driver removes whatever of theirs is left and held by no live process.
        """
        import ray

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
        return compat_sglang.cleanup_shm()


def error_line(e: BaseException) -> str:
    """One line: the exception raised inside the actor (Ray wraps it), else the last line Ray reports."""
    inner = getattr(e, "cause", None)
    if isinstance(inner, BaseException):
        first = (str(inner).strip().splitlines() or [""])[0]
        return f"{type(inner).__name__}: {first}"[:400]
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" ")]
    last = lines[-1] if lines else type(e).__name__
    return last if len(last) < 400 else last[:400] + "…"


def _check_moe_tp(cfg: dict, parallel: ParallelSpec, gpu: int) -> None:
    """Refuse, before any trainer process starts, what cannot train on CPU ranks: an MoE model at TP > 1. Megatron
    trains MoE with TP only under sequence parallelism ("performance may degrade if MoE and tensor parallelism
    are enabled without also enabling sequence parallelism", moe_layer.py), which the torch LayerNorm of the
    local spec (no Transformer Engine, no GPU) refuses ("sequence parallel not supported by torch LayerNorm")."""
    if num_experts(cfg) and parallel.tp > 1 and not gpu:
        raise ValueError(f"tp={parallel.tp} is invalid for an MoE model on CPU trainer ranks: Megatron needs "
                         "sequence parallelism for MoE with TP, which its LayerNorm without Transformer Engine "
                         "refuses; use ep (expert parallelism) instead")

