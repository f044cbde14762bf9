"""A rank's copy-plan view at engine TP > 1: which part of each HF tensor it holds, and where that part goes.

At TP 1 a HF tensor lands whole in a slice of one engine parameter (`LabkitWeights.param_view`). At TP > 1 each
rank holds a piece of it (labkit.engine.shard, the same rule the verifier hashes each rank's expectation by):
the rank's copy takes that piece of the bucket's tensor (`src`: dim, start, length) into the matching slice of
its own, smaller parameter. A CPU engine pads FFN widths (to 32 * tp) and vocabulary tables first; a rank whose
piece lies wholly in the padding holds nothing of the tensor (`NOTHING`), its padding stays zero.

Without this, a TP > 1 engine sent every tensor through SGLang's `load_weights` (its loaders shard by
themselves): correct, but a Python loop with name matching per tensor on every rank, the path labkit's copy
plan exists to avoid (labkit.engine.inside.apply).
"""

from __future__ import annotations

import torch

from labkit.engine.contract import engine_shape, ffn_padding
from labkit.engine.shard import Piece, Sharding

NOTHING = "nothing"  # the rank holds only padding of this tensor: nothing to copy
EXPERT_PARAMS = ("w13_weight", "w2_weight")


def expert_view(weight: torch.Tensor, kind: str, index: int, true_ffn: int | None) -> torch.Tensor:
    """The slice of FusedMoE's stacked `weight` that holds one HF expert tensor: `w13_weight` shard 2e is
    expert e's gate (rows [0, I) of the padded 2*Ip), 2e+1 its up (rows [Ip, Ip+I)); `w2_weight` shard e is
    its down (columns [0, I)). `true_ffn` None: unpadded (I = Ip)."""
    if kind.startswith("w2_weight"):
        return weight[index].narrow(1, 0, true_ffn or weight.shape[2])
    padded = weight.shape[1] // 2
    return weight[index // 2].narrow(0, (index % 2) * padded, true_ffn or padded)


def shard_sizes(module, tp: int = 1) -> list[int]:
    """Row blocks of a fused linear on one rank: QKVParallelLinear's q/k/v shard sizes (per rank already), else
    `output_sizes` (MergedColumnParallelLinear's whole sizes) split over tp."""
    if hasattr(module, "q_proj_shard_size"):
        return [module.q_proj_shard_size, module.kv_proj_shard_size, module.v_proj_shard_size]
    return [s // tp for s in module.output_sizes]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sharding(model, tp: int) -> Sharding:
    """The engine's sharding, from the model's config as SGLang read it (head counts before a CPU engine's
    padding: `original_*`, which labkit.engine.shard refuses)."""
    cfg = model.config
    heads = getattr(cfg, "original_num_attention_heads", None) or cfg.num_attention_heads
    kv = None if getattr(cfg, "kv_lora_rank", None) else (
        getattr(cfg, "original_total_num_kv_heads", None) or getattr(cfg, "num_key_value_heads", None) or heads)
    return Sharding(tp, heads, kv, _device())


def view(model, name: str, shape: tuple[int, ...], tp: int, rank: int):
    """(engine parameter name, destination slice, source piece of the HF tensor or None: whole) for HF tensor
    `name` of `shape` on TP rank `rank`; (name, NOTHING, piece) where the rank holds only padding of it; None
    where the model's own loader must take it."""
    piece = None
    if tp > 1:
        padded = engine_shape(name, tuple(shape), ffn_padding(_device(), tp), tp)
        piece = _sharding(model, tp).pieces(name, padded)[rank]
    if piece is None:  # TP 1, or replicated: the whole tensor
        found = model.param_view(name)
        return None if found is None else (*found, None)
    dim, start, length = piece
    real = max(0, min(length, shape[dim] - start))  # the checkpoint's extent inside the rank's piece
    if real == 0:
        return name, NOTHING, piece
    return _destination(model, name, (dim, start, real), tp)


def _destination(model, name: str, src: Piece, tp: int):
    dim, _, real = src
    part = model.labkit_fused_part(name)
    target = name if part is None else part[0]
    try:
        weight = model.get_parameter(target).data
    except AttributeError:
        return None
    if part is not None and target.endswith(EXPERT_PARAMS):  # FusedMoE: [E, 2 * I/tp, H] / [E, H, I/tp]
        return target, expert_view(weight, target.rsplit(".", 1)[1], part[1], real), src
    if part is not None:  # q/k/v or gate/up rows: the rank's own row blocks
        sizes = shard_sizes(model.get_submodule(target.rsplit(".", 1)[0]), tp)
        return target, weight.narrow(0, sum(sizes[:part[1]]), real), src
    return target, weight.narrow(dim, 0, real), src
