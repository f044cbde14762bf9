"""One Megatron-core rank: model built from an HF directory through mbridge, Megatron DDP + optimizer, export.

A `TrainerRank` lives in its own process (a Ray actor, see `labkit.trainer.group`); TP/PP ranks talk over
gloo on CPU and NCCL on GPU. Every rank runs every call (they are collective); results that only one
rank holds are returned there and None elsewhere.
"""

from __future__ import annotations

import os
from datetime import timedelta
from functools import partial

import torch
from torch.multiprocessing import reductions

from labkit.cluster import allocator, shm_manager
from labkit.cluster.runtime import node_ip
from labkit.compat import loopback, quiet
from labkit.compat import megatron as compat
from labkit.config import ParallelSpec, TrainConfig
from labkit.models.hf import load_hf_config
from labkit.trainer import bridge as fixes  # called as fixes.export_unique: tests swap it inside the actor
from labkit.trainer import steps
from labkit.trainer.clip import clip_by_group
from labkit.trainer.mtp_loss import detach_trunk, freeze_mtp


def _init_distributed(rank: int, world_size: int, master_addr: str, master_port: int, parallel: ParallelSpec,
                      listen_sock=None):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        # Rank 0 hosts the rendezvous store on master_addr only (torch's own tcp:// store binds the wildcard).
        store = loopback.tcp_store(master_addr, master_port, world_size, rank == 0, timedelta(minutes=5),
                                   sock=listen_sock)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(minutes=5))
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(parallel.tp, parallel.pp, expert_model_parallel_size=parallel.ep)


class TrainerRank:
    """Megatron model + optimizer on one rank. Construct with the rank's place in the world, then `load()`."""

    def __init__(self, *, parallel: ParallelSpec, train: TrainConfig, threads: int | None = None):
        quiet.install()  # before Megatron is imported (setup): its CPU-box warnings say nothing actionable
        allocator.install()  # freed buckets go back to the system (labkit.cluster.allocator)
        self.shm_joined = shm_manager.join()  # before anything is shared (labkit.cluster.shm_manager)
        if threads:
            torch.set_num_threads(threads)
        self.parallel, self.train_cfg = parallel, train
        self.rank, self.compat, self._listen = None, [], None
        self.models = self.bridge = self.optimizer = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a port bound there: rank 0 hosts the rendezvous (works on any Ray cluster).
        The socket is bound now and handed to the store in `setup`, so no other program can take the port."""
        self._listen = loopback.listen(node_ip())
        return self._listen.getsockname()[:2]

    def setup(self, rank: int, world_size: int, master_addr: str, master_port: int) -> list[str]:
        self.rank = rank
        self.compat = compat.apply()
        _init_distributed(rank, world_size, master_addr, master_port, self.parallel,
                          listen_sock=self._listen if rank == 0 else None)
        self._listen = None
        compat.model_parallel_seed(self.train_cfg.seed)
        return self.compat

    # ---------------------------------------------------------------- build
    def load(self, model_dir: str) -> dict:
        """Build the Megatron model from `model_dir` (config + safetensors) and the optimizer."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        hf_config = load_hf_config(model_dir)
        dtype = torch.float32 if not torch.cuda.is_available() else torch.bfloat16
        bridge = fixes.make_bridge(hf_config, dtype)
        bridge.set_extra_args(use_cpu_initialization=not torch.cuda.is_available(), masked_softmax_fusion=False,
                              sequence_parallel=False, hidden_dropout=0.0, attention_dropout=0.0,
                              # With the policy target Megatron's own MTP CE is only logged (scale 0).
                              mtp_loss_scaling_factor=self.train_cfg.mtp_loss_scale
                              if self.train_cfg.mtp_target == "tokens" else 0.0)
        ddp = dict(grad_reduce_in_fp32=True, use_distributed_optimizer=False, overlap_grad_reduce=False,
                   bucket_size=None)
        with quiet.stdout_to_stderr():
            models = bridge.get_model(bf16=dtype is torch.bfloat16, wrap_with_ddp=True, ddp_config=ddp)
        bridge.load_weights(models, model_dir)
        frozen = sum(freeze_mtp(m) for m in models) if self.train_cfg.mtp_loss_scale == 0 else 0
        self.hooks = [h for m in models for h in detach_trunk(m)] if self.train_cfg.mtp_detach else []
        tc = self.train_cfg  # mtp_clip="own": labkit clips trunk and MTP apart (trainer.clip), Megatron not at all
        cfg = OptimizerConfig(optimizer=tc.optimizer, lr=tc.lr, weight_decay=tc.weight_decay, adam_beta2=tc.adam_beta2,
                              clip_grad=0.0 if tc.mtp_clip == "own" else tc.clip_grad, bf16=dtype is torch.bfloat16,
                              params_dtype=dtype, use_distributed_optimizer=False)
        overrides = None
        if self.train_cfg.mtp_lr_mult != 1.0:
            from megatron.core.optimizer import ParamKey

            overrides = {ParamKey(name="*.mtp.*"): {"lr_mult": float(self.train_cfg.mtp_lr_mult)}}
        with compat.optimizer_scope():
            self.optimizer = get_megatron_optimizer(cfg, models, config_overrides=overrides)
        self.set_lr(self.train_cfg.lr)
        mcfg = models[0].config
        mcfg.finalize_model_grads_func = finalize_model_grads
        mcfg.grad_scale_func = self.optimizer.scale_loss
        self.models, self.bridge, self.model_dir = models, bridge, model_dir
        n = sum(p.numel() for m in models for p in m.parameters())
        return {"rank": self.rank, "params": n, "mtp_layers": mcfg.mtp_num_layers or 0, "compat": self.compat,
                "mtp_frozen_tensors": frozen, "mtp_detached": bool(self.hooks)}

    @property
    def _is_output_rank(self) -> bool:
        from megatron.core import parallel_state as ps

        return ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0

    # ---------------------------------------------------------------- train
    def train_step(self, tokens: torch.Tensor, loss_mask: torch.Tensor, weights: torch.Tensor | None = None,
                   mtp_only: bool = False) -> dict | None:
        """One optimizer step on next-token loss over `loss_mask` positions (+ Megatron's MTP loss).

        `weights` scales each sequence's token losses (advantages in RL); the MTP loss always sees the plain
        mask (the draft imitates every response token, good or bad). `mtp_only` zeroes the policy loss.
        Returns metrics on the output rank.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        for m in self.models:
            m.train()
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        batch = steps.make_batch(tokens, loss_mask, weights)
        n_micro = min(self.train_cfg.micro_batches, tokens.shape[0])
        micro = [{k: v.chunk(n_micro)[i] for k, v in batch.items()} for i in range(n_micro)]
        out = get_forward_backward_func()(
            forward_step_func=partial(steps.forward_step, total_tokens=float(batch["loss_mask"].sum().clamp(min=1)),
                                      policy_scale=0.0 if mtp_only else 1.0,
                                      kl_scale=self.train_cfg.mtp_loss_scale
                                      if self.train_cfg.mtp_target != "tokens" else 0.0,
                                      kind=self.train_cfg.mtp_target),
            data_iterator=iter(micro), model=self.models, num_microbatches=n_micro,
            seq_length=tokens.shape[1], micro_batch_size=micro[0]["tokens"].shape[0], forward_only=False)
        with compat.optimizer_scope():  # Megatron's norm and step, on CPU too
            norms = clip_by_group(self.models, self.train_cfg.clip_grad) if self.train_cfg.mtp_clip == "own" else {}
            ok, grad_norm, _ = self.optimizer.step()
        mtp = MTPLossLoggingHelper.tracker.get("values")
        mtp_loss = float(mtp.sum()) / n_micro if mtp is not None else float("nan")
        if mtp is not None:
            MTPLossLoggingHelper.clean_loss_in_tracker()
        if not self._is_output_rank:
            return None
        loss = sum(float(o["lm loss"]) for o in out)
        m = {"train/loss": loss, "mtp/loss": mtp_loss, "train/grad_norm": norms.get("trunk", float(grad_norm or 0.0)),
             "train/update_ok": bool(ok), **({"mtp/grad_norm": norms["mtp"]} if norms else {})}
        if out and "mtp kl" in out[0]:
            m["mtp/kl"] = sum(float(o["mtp kl"]) for o in out) / len(out)
        return m

    def set_lr(self, lr: float) -> None:
        """Learning rate for the next steps (schedules live in the caller)."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_mult", 1.0)

    # ---------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> dict | None:
        """Full-vocab logits of the main head and of each MTP head ([b, s, V] each) on the output rank."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        for m in self.models:
            m.eval()
        captured: dict = {}
        batch = steps.make_batch(tokens, torch.ones_like(tokens), None)
        get_forward_backward_func()(
            forward_step_func=partial(steps.logits_step, captured=captured), data_iterator=iter([batch]),
            model=self.models, num_microbatches=1, seq_length=tokens.shape[1],
            micro_batch_size=tokens.shape[0], forward_only=True)
        return captured if self._is_output_rank else None

    # ---------------------------------------------------------------- export
    @torch.no_grad()
    def export(self, to_cpu: bool = True, fast: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """HF-named full tensors (TP-gathered, PP-broadcast) on rank 0; every rank must call it."""
        out = [(n, t.detach().to("cpu") if to_cpu else t.detach())
               for n, t in fixes.export_unique(self.bridge, self.models, fast=fast)]
        return out if self.rank == 0 else None

    @torch.no_grad()  # the export's views (mbridge's q/k/v and gate/up splits) need no autograd graph
    def export_to(self, consumer, engine, cfg, engine_spec: dict | None = None, weight_version: str | None = None,
                  exclude: tuple[str, ...] = ()) -> dict | None:
        """Hand this rank's export to `consumer.run(named_iter, engine, cfg, engine_spec, weight_version, exclude)`
        (a consumer also has `close()`, called by `release`).
        Every rank must call it (the export is collective); rank 0 runs the consumer and returns its metrics.

        The consumer comes from the sync layer (`labkit.sync.session.Syncer`), pickled by Ray by reference to
        its class, so the trainer never imports sync/ (imports point down). The rank keeps the first consumer
        it gets per (consumer class, exclude) and runs that one on later syncs: it holds the replayed plan and
        the reusable buffers, so a second sync replays the plan instead of listing the export again.
        `exclude`: name substrings left out of the sync on purpose (e.g. the MTP draft, to study an unsynced
        draft): those engine tensors keep their weights and are reported in `sync/unverified`.
        """
        gen = fixes.export_unique(self.bridge, self.models)
        try:
            if self.rank != 0:
                return None
            kind = type(consumer)
            kept = self.__dict__.setdefault("consumers", {})
            consumer = kept.setdefault((kind.__module__, kind.__qualname__, tuple(exclude)), consumer)
            return consumer.run(gen, engine, cfg, engine_spec, weight_version, exclude=tuple(exclude))
        finally:
            # Whatever happened on rank 0, finish the export so no other rank waits in a collective forever.
            try:
                for _ in gen:
                    pass
            except Exception:
                pass

    def release(self) -> dict:
        """Free the sync buffers this rank holds (called by `Trainer.shutdown` before the actor is killed).

        The colocated transport's buffers are shared-memory files (`/dev/shm/torch_<pid>_*`, a bucket's size
        each) that torch unlinks only when this process drops its last reference; a killed actor never does,
        and the files held that RAM until the next labkit start. Returns this process's pid and the shm files
        of it that are still there (held by a reader that has not let go yet; the driver removes them once
        this process is dead).
        """
        for consumer in self.__dict__.pop("consumers", {}).values():
            consumer.close()  # a consumer frees its buffers (the Syncer: its pool)

        reductions.shared_cache.free_dead_references()
        prefix, shm = f"torch_{os.getpid()}_", "/dev/shm"
        left = sorted(f for f in os.listdir(shm) if f.startswith(prefix)) if os.path.isdir(shm) else []
        return {"pid": os.getpid(), "shm_left": left}
