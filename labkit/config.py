"""Small typed configs, validated on construction, and the one field list the CLI and notebooks are built from.

Every bad value fails here, before anything is built, with a message that names the field, the value
and what is allowed. A field with a closed set of values is typed `Literal[...]`: `choices()` reads the
allowed values from that type, so they are written once, and `check_choice` validates them; each field's
docstring (the string literal under it, torchtitan style) is its `--help` text (`add_arguments`).
This module is torch-free: a CLI or notebook checks its parameters before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Literal

Optimizer = Literal["adam", "sgd"]
MtpTarget = Literal["tokens", "policy", "topk", "tv", "dspark"]
MtpClip = Literal["own", "global"]


def check(ok: bool, name: str, value: object, allowed: str) -> None:
    """Raise a ValueError that names the parameter, the bad value and what is allowed."""
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: expected {allowed}")


def number(value: object, types: type | tuple[type, ...] = (int, float)) -> bool:
    """`value` is an instance of `types` but not a bool (an int to Python, never a count or a size here)."""
    return isinstance(value, types) and not isinstance(value, bool)


def _int(name: str, value: object, lo: int = 1) -> None:
    check(number(value, int) and value >= lo, name, value, f"an integer >= {lo}")


def choices(cls: type, name: str) -> tuple:
    """The allowed values of field `name` of dataclass `cls`, read from its `Literal[...]` type (None included
    for an Optional one; the items' for `tuple[Literal[...], ...]`); () for a field of any other type. The one
    place the allowed values are written."""
    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (Ellipsis,):
        hint = typing.get_args(hint)[0]
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    out: tuple = ()
    for m in members:
        if typing.get_origin(m) is Literal:
            out += typing.get_args(m)
    return out + ((None,) if out and type(None) in members else ())


def check_choice(obj: object, name: str, label: str | None = None) -> None:
    """`check` for a Literal-typed field of a config: the value must be one of `choices(type(obj), name)`."""
    allowed, v = choices(type(obj), name), getattr(obj, name)
    check(any(v == c and type(v) is type(c) for c in allowed), label or name, v,
          "one of " + ", ".join(str(c) for c in allowed))


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: its docstring}: the string literal right under each field in the class body (torchtitan style).
    Read from the source; {} where the source is not available (the CLI then shows no help, nothing breaks)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for a, b in zip(body, body[1:]):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
            out[a.target.id] = " ".join(b.value.value.split())
    return out


_KINDS = {int: (int, "an integer"), float: (float, "a number"), str: (str, "a string")}


def _kind(hint) -> type:
    """int, float, str or bool: the scalar a field's type parses to (Optional and Literal unwrapped)."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for m in members:
        if typing.get_origin(m) is Literal:
            return type(typing.get_args(m)[0])
        if m in (int, float, str, bool):
            return m
    raise TypeError(f"add_arguments: no command-line form for a field of type {hint!r}")


def _parser(base: object, name: str, kind: type):
    """argparse `type=`: parse the text, then validate it with the config itself (one copy of each rule), so a
    bad flag fails at parse time naming the field and the text as typed. A rule that involves another
    field (say bucket_mb vs memory_budget_mb) is left to the config's constructor, which names that field."""
    conv, what = _KINDS[kind]

    def parse(text: str):
        try:
            v = conv(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is invalid: expected {what}") from None
        try:
            dataclasses.replace(base, **{name: v})
        except ValueError as e:
            msg = str(e)
            head = msg.split("=", 1)[0]  # "bucket_mb" or "EngineConfig.url": this field's own rule?
            if head == name or head.endswith("." + name):
                if " is invalid: expected " in msg:
                    msg = f"{name}={text!r} is invalid: expected " + msg.split(" is invalid: expected ", 1)[1]
                raise argparse.ArgumentTypeError(msg) from None
        return v
    return parse


def add_arguments(parser: argparse.ArgumentParser, cls: type, fields: tuple[str, ...], *, base: object = None,
                  flags: dict[str, str] | None = None, keep: bool = False, notes: dict[str, str] | None = None) -> None:
    """One `--flag` per field of dataclass `cls`, its default, allowed values (the field's Literal) and help (the
    field's docstring) read from the dataclass, so the CLI restates none of them.

    base: the instance whose values are the defaults (default `cls()`); flags: {field: flag} where the flag
    is not `--field-name`; keep=True: the flag defaults to None ("keep base's value", for override-style
    commands), its help naming base's value; notes: {field: text} appended to a field's help.
    Bool fields become `store_true` flags (their default must be False).
    """
    base = cls() if base is None else base
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for name in fields:
        flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
        default, allowed = getattr(base, name), choices(cls, name)
        text = " ".join(x for x in (docs.get(name, ""), (notes or {}).get(name, "")) if x)
        kind = _kind(hints[name])
        if kind is bool:
            check(default is False, f"{cls.__name__}.{name}", default, "False for a store_true flag")
            parser.add_argument(flag, action="store_true", help=text.replace("%", "%%"))
            continue
        shown = [c for c in allowed if c is not None]
        metavar = "{" + ",".join(map(str, shown)) + "}" if shown else None
        text += f" (default: {default})"
        parser.add_argument(flag, type=_parser(base, name, kind), default=None if keep else default,
                            metavar=metavar, help=text.replace("%", "%%"))


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    """Sizes of the tiny MiMo-style model (Qwen2 trunk + MTP layers). Defaults train on 2 CPU cores in minutes."""

    hidden: int = 128
    """Hidden size (a multiple of heads)."""
    layers: int = 2
    """Trunk transformer layers."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int = 2
    """Key/value heads (GQA; a divisor of heads)."""
    ffn: int = 384
    """MLP intermediate size."""
    mtp_layers: int = 1
    """MTP layers (the draft); 0: none."""
    max_positions: int = 256
    """Longest sequence the RoPE tables cover."""
    vocab: int = 128
    """Embedding rows: the char tokenizer's 100 entries padded so TP=2 splits them; an odd size (131) is what a
    real checkpoint may have (the engine pads it, labkit.engine.contract.engine_rows)."""
    seed: int = 0
    """Initialisation seed."""

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "kv_heads", "ffn", "max_positions"):
            _int(f, getattr(self, f))
        _int("vocab", self.vocab, lo=100)  # labkit.models.tokenizer.VOCAB's entries
        _int("mtp_layers", self.mtp_layers, lo=0)
        _int("seed", self.seed, lo=0)
        check(self.hidden % self.heads == 0, "hidden", self.hidden, f"a multiple of heads={self.heads}")
        check(self.heads % self.kv_heads == 0, "kv_heads", self.kv_heads, f"a divisor of heads={self.heads}")


@dataclass(kw_only=True, slots=True, frozen=True)
class ParallelSpec:
    """Megatron model parallelism. Each rank is one process (a Ray actor); gloo on CPU, NCCL on GPU."""

    tp: int = 1
    """Megatron tensor-parallel size."""
    pp: int = 1
    """Megatron pipeline-parallel size."""
    ep: int = 1
    """Megatron expert-parallel size (MoE models): each of `ep` ranks holds 1/ep of every layer's experts and a
    replica of the rest of the model (data-parallel over the same batch, so losses equal ep=1's)."""

    def __post_init__(self) -> None:
        _int("tp", self.tp)
        _int("pp", self.pp)
        _int("ep", self.ep)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.ep


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainConfig:
    """Optimizer and loss settings for the Megatron trainer (pretraining, SFT, and each RL step's update)."""

    lr: float = 1e-3
    """Learning rate (of the trunk; the MTP layers get lr * mtp_lr_mult)."""
    optimizer: Optimizer = "adam"
    """adam, or sgd (momentum 0.9): RL from a checkpoint without its Adam state."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    clip_grad: float = 1.0
    """Gradient-norm clip."""
    mtp_clip: MtpClip = "own"
    """own: trunk and MTP layers clipped by separate norms (a draft cannot shrink the policy's step); global: one."""
    adam_beta2: float = 0.999
    """Adam's beta2 (pretraining uses 0.98)."""
    mtp_loss_scale: float = 0.1
    """Megatron's mtp_loss_scaling_factor; 0 freezes the MTP layers."""
    mtp_detach: bool = False
    """MTP gradients stop at the trunk (labkit.trainer.mtp_loss; RL); pretraining trains both."""
    mtp_target: MtpTarget = "tokens"
    """What the draft learns: tokens (CE on the sampled tokens, Megatron's), or the main head's distribution:
    policy (KL), topk (top-8 soft CE, SkyRL), tv (total variation, Bebop), dspark (0.1 CE + 0.9 TV, NeMo-RL)."""
    mtp_lr_mult: float = 1.0
    """The MTP layers' lr over the trunk's: a draft must keep up with a moving policy."""
    micro_batches: int = 1
    """Micro-batches per optimizer step."""
    seed: int = 1234
    """Trainer seed (dropout, data order)."""

    def __post_init__(self) -> None:
        check(isinstance(self.lr, (int, float)) and 0 < self.lr < 1, "lr", self.lr, "a float in (0, 1)")
        check_choice(self, "optimizer")
        check(isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0, "weight_decay", self.weight_decay,
              ">= 0")
        check(isinstance(self.clip_grad, (int, float)) and self.clip_grad > 0, "clip_grad", self.clip_grad, "> 0")
        check(isinstance(self.adam_beta2, float) and 0 < self.adam_beta2 < 1, "adam_beta2", self.adam_beta2,
              "a float in (0, 1)")
        check(isinstance(self.mtp_loss_scale, (int, float)) and self.mtp_loss_scale >= 0,
              "mtp_loss_scale", self.mtp_loss_scale, ">= 0")
        check(isinstance(self.mtp_detach, bool), "mtp_detach", self.mtp_detach, "True or False")
        check(isinstance(self.mtp_lr_mult, (int, float)) and self.mtp_lr_mult > 0, "mtp_lr_mult", self.mtp_lr_mult,
              "> 0")
        check_choice(self, "mtp_target")
        check_choice(self, "mtp_clip")
        check(self.mtp_target == "tokens" or self.mtp_detach, "mtp_target", self.mtp_target,
              "tokens unless mtp_detach=True (the policy target must not train the trunk towards the draft)")
        _int("micro_batches", self.micro_batches)
        _int("seed", self.seed, lo=0)
