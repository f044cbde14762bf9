"""Small typed configs, validated on construction.

Every bad value fails here, before anything is built, with a message that names the field, the value
and what is allowed. Notebooks and the CLI build these from plain literals.
"""

from __future__ import annotations

from dataclasses import dataclass


def check(ok: bool, name: str, value: object, allowed: str) -> None:
    """Raise a ValueError that names the parameter, the bad value and what is allowed."""
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: expected {allowed}")


def _int(name: str, value: object, lo: int = 1) -> None:
    check(isinstance(value, int) and not isinstance(value, bool) and value >= lo, name, value, f"an integer >= {lo}")


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    """Sizes of the tiny MiMo-style model (Qwen2 trunk + MTP layers). Defaults train on 2 CPU cores in minutes."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 384
    mtp_layers: int = 1
    max_positions: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "kv_heads", "ffn", "max_positions"):
            _int(f, getattr(self, f))
        _int("mtp_layers", self.mtp_layers, lo=0)
        _int("seed", self.seed, lo=0)
        check(self.hidden % self.heads == 0, "hidden", self.hidden, f"a multiple of heads={self.heads}")
        check(self.heads % self.kv_heads == 0, "kv_heads", self.kv_heads, f"a divisor of heads={self.heads}")


@dataclass(kw_only=True, slots=True, frozen=True)
class ParallelSpec:
    """Megatron model parallelism. Each rank is one process (a Ray actor); gloo on CPU, NCCL on GPU."""

    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        _int("tp", self.tp)
        _int("pp", self.pp)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainConfig:
    """Optimizer and loss settings for the Megatron trainer."""

    lr: float = 1e-3
    optimizer: str = "adam"  # or "sgd" (momentum 0.9): RL from a checkpoint without its Adam state
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    adam_beta2: float = 0.999
    mtp_loss_scale: float = 0.1  # Megatron's mtp_loss_scaling_factor; 0 freezes the MTP layers
    mtp_detach: bool = False  # RL: MTP gradients stop at the trunk (labkit.mtp.loss); pretraining trains both
    mtp_target: str = "tokens"  # "tokens": CE on the sampled tokens; "policy": KL to the main head (labkit.mtp.loss)
    mtp_lr_mult: float = 1.0  # the MTP layers' lr over the trunk's: a draft must keep up with a moving policy
    micro_batches: int = 1
    seed: int = 1234

    def __post_init__(self) -> None:
        check(isinstance(self.lr, (int, float)) and 0 < self.lr < 1, "lr", self.lr, "a float in (0, 1)")
        check(self.optimizer in ("adam", "sgd"), "optimizer", self.optimizer, "adam or sgd")
        check(isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")
        check(isinstance(self.clip_grad, (int, float)) and self.clip_grad > 0, "clip_grad", self.clip_grad, "> 0")
        check(isinstance(self.adam_beta2, float) and 0 < self.adam_beta2 < 1, "adam_beta2", self.adam_beta2,
              "a float in (0, 1)")
        check(isinstance(self.mtp_loss_scale, (int, float)) and self.mtp_loss_scale >= 0,
              "mtp_loss_scale", self.mtp_loss_scale, ">= 0")
        check(isinstance(self.mtp_detach, bool), "mtp_detach", self.mtp_detach, "True or False")
        check(isinstance(self.mtp_lr_mult, (int, float)) and self.mtp_lr_mult > 0, "mtp_lr_mult", self.mtp_lr_mult,
              "> 0")
        check(self.mtp_target in ("tokens", "policy"), "mtp_target", self.mtp_target, "tokens or policy")
        check(self.mtp_target == "tokens" or self.mtp_detach, "mtp_target", self.mtp_target,
              "tokens unless mtp_detach=True (the policy target must not train the trunk towards the draft)")
        _int("micro_batches", self.micro_batches)
        _int("seed", self.seed, lo=0)
