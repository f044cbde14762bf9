"""The engine contract: how HF tensor names land in the engine's parameters, and which tensors it accepts.

Written down once, here, for everyone who needs it: the bucket planner (labkit.sync.plan), the verifier
(labkit.sync.verify), the engine's model code (labkit.engine.inside.sglang_models.mimo) and the engine handle.
Two copies of these facts drift, and each drift was a silent failure:

1. Fused groups (`FUSED`, `fused_part`, `fused_group`). SGLang loads some HF tensors into one fused parameter,
   each HF tensor a block of rows at its shard index: q/k/v into `qkv_proj`, gate/up into `gate_up_proj`.
   A group split across buckets leaves the engine with dummy weights between buckets (train-vs-rollout KL
   ~1.5), and a verifier that hashes q, k and v apart has nothing on the engine to compare with. A model
   family that fuses more adds rows to `FUSED`. MoE experts (SGLang's FusedMoE):
   `mlp.experts.{e}.gate_proj/up_proj.weight` -> `mlp.experts.w13_weight` (E, 2I, H) is shard 2e+0/1 and
   `down_proj` -> `w2_weight` (E, H, I) shard e; concatenating the shards on dim 0 in index order gives the
   stacked parameter's bytes in FusedMoE's default layout, so the verifier hashes it unchanged. E is not in
   a name: `part_counts` reads it off the whole tensor list. Unlike q/k/v, expert slices may land in different
   buckets (`plan_group`): FusedMoE's loader writes each slice into its own rows, one call or many (the
   feasibility run updated one expert's gate alone and only that slice changed), and a layer's experts can
   be larger than a bucket (Qwen3-30B-A3B: 1.2 GB per layer in bf16).
2. The expected tensors (`Contract`, `check_tensors`). SGLang's loaders look tensors up by name and copy in
   place: an unknown name or a wrong shape fails inside the scheduler after part of a request has landed
   (a fused loader's shape mismatch can take the scheduler down). So every sync plan (names, shapes, dtypes)
   and every update call of the handle (names, shapes) is checked against the model dir's checkpoint headers
   first, by one check with one message, and refused whole: nothing reaches the engine.

Pure Python, no torch: the sync layer above and the engine's model code below both import it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

from labkit.engine.errors import EngineError
from labkit.models.fp8 import E4M3, SCALE_SUFFIX, recipe_of
from labkit.models.hf import checkpoint_tensors

Shape = tuple[int, ...]
CAP = 10  # problems named in one message; the rest are counted
# SGLang holds DeepSeek's router bias in float32 whatever the serving dtype (`models/deepseek_v2.py:519-520`: a bf16
# bias reorders top-k routing); a bf16 engine's contract that said bf16 would refuse its own checkpoint's bias.
FLOAT32_HELD = (".e_score_correction_bias",)


@dataclass(frozen=True, slots=True)
class FusedRule:
    """HF `<prefix>.<part>.<weight|bias>` is row block `index` (of `size` blocks, in index order) of the engine's
    `<prefix>.<fused>.<weight|bias>`."""
    part: str
    fused: str
    index: int
    size: int


FUSED: tuple[FusedRule, ...] = (
    FusedRule("q_proj", "qkv_proj", 0, 3), FusedRule("k_proj", "qkv_proj", 1, 3),
    FusedRule("v_proj", "qkv_proj", 2, 3),
    FusedRule("gate_proj", "gate_up_proj", 0, 2), FusedRule("up_proj", "gate_up_proj", 1, 2),
    # DeepSeek-V3 MLA with q_lora_rank (MLA without one, Moonlight's, fuses nothing: `standalone`)
    FusedRule("q_a_proj", "fused_qkv_a_proj_with_mqa", 0, 2),
    FusedRule("kv_a_proj_with_mqa", "fused_qkv_a_proj_with_mqa", 1, 2),
)
# Megatron exports an MLA layer's q_a, q_b, kv_a in that order: q_b rides in the a-pair's plan group, so a bucket,
# filled in export order, never has to take kv_a before q_b.
_MLA_GROUP = re.compile(r"^(?P<prefix>.*\.self_attn)\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa)\.weight$")
_RULES = {r.part: r for r in FUSED}
# `weight_scale_inv`: a block-FP8 weight's scale (labkit.models.fp8) fuses as its weight does, `sizes[i] / 128` rows
# at `sum(sizes[:i]) / 128` (every fused part a multiple of the block, as SGLang's Fp8 methods require).
_NAME = re.compile(rf"^(?P<prefix>.*)\.(?P<part>{'|'.join(map(re.escape, _RULES))})\."
                   r"(?P<kind>weight|bias|weight_scale_inv)$")


_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<part>gate_proj|up_proj|down_proj)"
                     r"\.(?P<kind>weight|weight_scale_inv)$")


_MLA_A = re.compile(r"^(?P<prefix>.*\.self_attn)\.(?P<part>q_a_proj|kv_a_proj_with_mqa)\.")
NONE: frozenset[str] = frozenset()
MLA_PLAIN = ("q_proj", "kv_a_proj_with_mqa")  # what MLA without a q LoRA loads unfused


def standalone(names: Iterable[str]) -> frozenset[str]:
    """The names a `FUSED` rule matches that load alone in this model: MLA without a q LoRA (Moonlight's
    `q_lora_rank: null`) has a plain `q_proj` beside `kv_a_proj_with_mqa`, and SGLang fuses neither (no q_a to
    pair kv_a with; q is not part of a q/k/v). Read off a whole model's (or plan's) names, as `part_counts`
    reads the expert count: the name alone cannot tell Moonlight's `self_attn.q_proj` from Qwen's."""
    names, kv_a, q_a = list(names), set(), set()
    for m in filter(None, map(_MLA_A.match, names)):
        (q_a if m["part"] == "q_a_proj" else kv_a).add(m["prefix"])
    plain = kv_a - q_a
    return frozenset(n for n in names if n.rsplit(".", 2)[0] in plain
                     and n.split(".")[-2] in MLA_PLAIN) if plain else NONE


def fused_part(name: str, alone: frozenset[str] = NONE) -> tuple[str, int, int | None] | None:
    """(engine-side fused name, shard index, group size) for a HF tensor that loads into a fused parameter,
    else None. The size of an expert group (None) depends on the model: `part_counts`. `alone`: the model's
    `standalone` names (a MLA model without q LoRA; empty for every other)."""
    return None if name in alone else _fused_part(name)


@lru_cache(maxsize=1 << 16)  # per tensor per sync: 4,179 regex matches on the MoE preset; Qwen3-30B has 18,867
def _fused_part(name: str) -> tuple[str, int, int | None] | None:
    m = _EXPERT.match(name)
    if m is not None:
        e, kind = int(m["e"]), m["kind"].removeprefix("weight")  # "" or "_scale_inv"
        if m["part"] == "down_proj":
            return f"{m['prefix']}.w2_weight{kind}", e, None
        return f"{m['prefix']}.w13_weight{kind}", 2 * e + (m["part"] == "up_proj"), None
    m = _NAME.match(name)
    if m is None:
        return None
    r = _RULES[m["part"]]
    return f"{m['prefix']}.{r.fused}.{m['kind']}", r.index, r.size


def fused_group(name: str) -> str:
    """The engine-side parameter a HF tensor loads into (e.g. ...qkv_proj.weight), else the name itself."""
    part = fused_part(name)
    return name if part is None else part[0]


def plan_group(name: str, alone: frozenset[str] = NONE) -> str:
    """The unit a bucket plan never splits: the fused parameter its parts must land in together, or the tensor
    itself (an expert slice loads alone). A block-FP8 scale travels in its weight's group, so the engine never
    serves a new weight with an old scale (or an old weight with a new one)."""
    if name.endswith(SCALE_SUFFIX):
        name = name.removesuffix("_scale_inv")
    if _EXPERT.match(name) is not None or name in alone:
        return name
    m = _MLA_GROUP.match(name)
    return f"{m['prefix']}.{FUSED[-1].fused}.weight" if m is not None else fused_group(name)


def call_group(name: str, alone: frozenset[str] = NONE) -> str:
    """The unit one update call of the per-tensor baseline carries: the tensor alone, except DeepSeek's MLA
    a-pair (SGLang's loader writes `fused_qkv_a_proj_with_mqa` only when q_a and kv_a arrive in one call; two
    calls both answer Success and leave it unwritten), which travels as its plan group."""
    return plan_group(name, alone) if _MLA_GROUP.match(name) is not None else name


def part_counts(names: Iterable[str]) -> dict[str, int]:
    """{fused engine parameter: how many HF tensors fill it} over a whole model's (or plan's) tensor names."""
    names = list(names)
    alone = standalone(names)
    out: dict[str, int] = {}
    for name in names:
        part = fused_part(name, alone)
        if part is not None:
            out[part[0]] = out.get(part[0], 0) + 1
    return out


VOCAB_TABLES = ("model.embed_tokens.weight", "lm_head.weight")
VOCAB_PADDING = 64  # SGLang's DEFAULT_VOCAB_PADDING_SIZE (layers/vocab_parallel_embedding.py, 0.5.23)


def engine_rows(name: str, rows: int, tp: int = 1) -> int:
    """Rows the engine's parameter holds for HF tensor `name` of `rows` rows: SGLang pads vocabulary tables to a
    multiple of 64 (of 64 * tp when TP would not divide that) and zero-fills the padding at load, so a checksum
    of the engine's table covers those zero rows too (a vocab of 131 is served as 192 rows)."""
    if name not in VOCAB_TABLES:
        return rows
    pad = VOCAB_PADDING if -(-rows // VOCAB_PADDING) * VOCAB_PADDING % tp == 0 else VOCAB_PADDING * tp
    return -(-rows // pad) * pad


FFN_PADDING_CPU = 32  # SGLang's DEFAULT_MOE_PADDING_SIZE (configs/update_config.py, 0.5.23)
_FFN_ROWS, _FFN_COLS = (".gate_proj.weight", ".up_proj.weight"), (".down_proj.weight",)


def ffn_padding(device: str, tp: int = 1) -> int:
    """The multiple SGLang pads FFN widths to on an engine on `device`: a CPU engine pads intermediate_size,
    moe_intermediate_size and shared_expert_intermediate_size to a multiple of 32 * tp
    (`adjust_config_with_unaligned_cpu_tp`, run only where device == "cpu"); 1 (no padding) elsewhere."""
    return FFN_PADDING_CPU * tp if device == "cpu" else 1


@lru_cache(maxsize=1 << 16)
def engine_shape(name: str, shape: tuple[int, ...], ffn_pad: int = 1, tp: int = 1) -> tuple[int, ...]:
    """The shape HF tensor `name` takes inside the engine's parameter: vocabulary rows padded (`engine_rows`, at tp);
    an MLP's or expert's gate/up rows and down columns padded to a multiple of `ffn_pad` (`ffn_padding`). The
    true extent sits at the start of each padded block and the padding is zero (SGLang's loaders narrow the
    destination to the checkpoint's size and the parameter was zero-filled)."""
    shape = tuple(shape)
    if not shape:
        return shape
    if name in VOCAB_TABLES:
        return (engine_rows(name, shape[0], tp), *shape[1:])
    if ffn_pad > 1 and ".mlp." in name and len(shape) == 2:
        if name.endswith(_FFN_ROWS):
            return (-(-shape[0] // ffn_pad) * ffn_pad, shape[1])
        if name.endswith(_FFN_COLS):
            return (shape[0], -(-shape[1] // ffn_pad) * ffn_pad)
    return shape


class ContractMismatch(EngineError, ValueError):
    """Tensors that do not fit the engine's model, refused before anything is sent (the engine keeps its
    weights). An EngineError for the handle's callers, a ValueError (bad input) for the sync plan's."""


def mismatches(expected: Mapping[str, tuple[Shape, str]], items: Iterable[tuple]) -> list[str]:
    """One line per bad tensor. `items`: (name, shape) or (name, shape, dtype) tuples; a dtype of None (or
    none given) is not checked."""
    problems = []
    for name, shape, *rest in items:
        dtype = rest[0] if rest else None
        if not isinstance(name, str):
            problems.append(f"{name!r}: a tensor name must be a string")
            continue
        if name not in expected:
            problems.append(f"{name!r}: not a weight of the engine's model")
            continue
        want_shape, want_dtype = expected[name]
        if tuple(shape) != tuple(want_shape):
            problems.append(f"{name!r}: shape {tuple(shape)} != engine {tuple(want_shape)}")
        if dtype is not None and dtype != want_dtype:
            problems.append(f"{name!r}: dtype {dtype} != engine {want_dtype}")
    return problems


def check_tensors(expected: Mapping[str, tuple[Shape, str]] | None, items: Iterable[tuple], what: str) -> None:
    """The one check (sync plan and handle alike): raises ContractMismatch naming the bad tensors (at most
    CAP, the rest counted). `expected` None: labkit cannot see the engine's model (a remote engine)."""
    if expected is None:
        return
    problems = mismatches(expected, items)
    if problems:
        more = f" (+{len(problems) - CAP} more)" if len(problems) > CAP else ""
        raise ContractMismatch(f"{what} does not match the engine's model, refused before sending (the engine "
                               "keeps its weights): " + "; ".join(problems[:CAP]) + more)


@dataclass(frozen=True)
class Contract:
    """What the engine's model accepts: {HF name: (shape, dtype)}, the dtype it serves in, the multiple its
    FFN widths are padded to (`ffn_padding`; 1: none), and for a block-FP8 checkpoint its recipe (`quant`:
    labkit.models.fp8.recipe_of; None: unquantized)."""
    tensors: dict[str, tuple[Shape, str]]
    dtype: str
    ffn_pad: int = 1
    quant: dict | None = None

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, dtype: str = "auto") -> Contract:
        """Names and shapes from the checkpoint headers (the HF names SGLang's loader accepts); every tensor
        expected in the serving dtype (`auto`: config.json's torch_dtype, as SGLang reads it), except in a
        block-FP8 checkpoint, whose fp8 weights and float32 scales are held as the headers say, and the tensors
        SGLang holds in float32 whatever the serving dtype (`FLOAT32_HELD`)."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        if dtype == "auto":
            dtype = config.get("torch_dtype", "bfloat16")
        quant = recipe_of(config)

        def held(n: str, d: str) -> str:
            if quant is not None and (d == E4M3 or n.endswith(SCALE_SUFFIX)):
                return d
            return "float32" if n.endswith(FLOAT32_HELD) else dtype

        return cls({n: (tuple(shape), held(n, d)) for n, (shape, d) in checkpoint_tensors(model_dir).items()},
                   dtype, quant=quant)

    @classmethod
    def find(cls, model_dir: str, dtype: str = "auto") -> Contract | None:
        """The contract of a local model dir, cached until its weights or config change; None when labkit cannot
        see the checkpoint (a remote engine, model_dir "<remote>"). Every sync asks for it, and reading thousands
        of safetensors headers afresh each time would be paid on every sync, in the caller's process."""
        d = Path(model_dir)
        files = sorted(d.glob("*.safetensors")) if d.is_dir() else []
        if not files:
            return None
        return _cached(str(d.resolve()), tuple(_stamp(f) for f in [*files, d / "config.json"]), dtype)

    def check(self, items: Iterable[tuple], what: str) -> None:
        check_tensors(self.tensors, items, what)

    def spec(self, ffn_pad: int | None = None) -> dict:
        """The plain, picklable form the sync layer passes around: {"tensors": {...}, "dtype": ...,
        "ffn_pad": ...} (a copy; `ffn_pad` given: the engine's, which only the engine's device decides)."""
        return {"tensors": dict(self.tensors), "dtype": self.dtype, "ffn_pad": ffn_pad or self.ffn_pad,
                "quant": self.quant}


def _stamp(f: Path) -> tuple:
    """(name, mtime_ns, size) of a file, one stat; (name,) for a file that is not there."""
    try:
        st = f.stat()
    except FileNotFoundError:
        return (f.name,)
    return (f.name, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _cached(model_dir: str, stamps: tuple, dtype: str) -> Contract:
    return Contract.from_model_dir(model_dir, dtype)
