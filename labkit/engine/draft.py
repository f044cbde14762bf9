"""The engine's draft runner: which of its parameters holds which synced tensor.

With `EngineConfig.speculative` SGLang runs the MTP layer as the draft in a model runner of its own (MiMo:
`MiMoMTP`), whose parameters are loaded from the same weight updates as the target's (SGLang fans each update out
to both runners) and named differently: the MTP layer's decoder block under `model.mtp_block.`, its input
projection and norms under `model.`, and the vocabulary tables shared with the target. SGLang's weight checker
reports them under `draft.` (`_merge_checksum_payloads`). The field loses draft weights silently (vime #406,
vLLM #55076: the target synced, the draft still the old one), so a sync into a speculative engine is verified on
the draft runner's parameters too: every `draft.` checksum the engine reports must equal the trainer's checksum of
the tensor it mirrors (`mirrored`), and one that mirrors no tensor of the target's fails the check (`unmirrored`).

Pure Python: the engine's model code (the draft's weight access) and the verifier both import it.
"""

from __future__ import annotations

import re

from labkit.engine.shard import RANK_SEP

DRAFT = "draft."  # SGLang's prefix for the draft runner's checksum keys
_MTP = re.compile(r"^model\.mtp_layers\.(\d+)\.(.+)$")
_OUTSIDE_BLOCK = ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")
SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # the target's tensors, which the draft runner shares


def _split_rank(name: str) -> tuple[str, str]:
    """(name, its TP rank suffix `#tp<r>` or "") of a checksum key (labkit.engine.shard.rank_key)."""
    base, sep, rank = name.partition(RANK_SEP)
    return base, sep + rank


def local_name(name: str) -> str | None:
    """The draft runner's name for target-layout name `name` (an HF name, or an engine one like `qkv_proj`; a rank's
    checksum key keeps its `#tp<r>`): MTP layer 0's tensors (`MiMoMTP.map_model_name_to_mtp_param_name`) and the
    shared vocabulary tables; None for every other tensor (the target's alone). MiMo's draft runs layer 0 only."""
    name, rank = _split_rank(name)
    local = _local(name)
    return None if local is None else local + rank


def _local(name: str) -> str | None:
    if name in SHARED:
        return name
    m = _MTP.match(name)
    if m is None or m[1] != "0":
        return None
    rest = m[2]
    return f"model.{rest}" if rest.split(".", 1)[0] in _OUTSIDE_BLOCK else f"model.mtp_block.{rest}"


def target_name(local: str) -> str | None:
    """The inverse of `local_name`: the target-layout name a draft runner's parameter mirrors, None for one that
    mirrors nothing labkit knows."""
    local, rank = _split_rank(local)
    target = _target(local)
    return None if target is None else target + rank


def _target(local: str) -> str | None:
    if local in SHARED:
        return local
    if local.startswith("model.mtp_block."):
        return "model.mtp_layers.0." + local[len("model.mtp_block."):]
    rest = local.removeprefix("model.")
    return f"model.mtp_layers.0.{rest}" if rest.split(".", 1)[0] in _OUTSIDE_BLOCK else None


def mirrored(expected: dict[str, str], actual: dict[str, str]) -> dict[str, str]:
    """The draft runner's expected checksums (`draft.` keys), from the target's: empty when the engine reports no
    draft runner."""
    if not any(k.startswith(DRAFT) for k in actual):
        return {}
    out = {}
    for name, checksum in expected.items():
        local = local_name(name)
        if local is not None:
            out[DRAFT + local] = checksum
    return out


def own(mirrors: dict[str, str]) -> int:
    """How many of `mirrors` are the draft runner's own parameters (the MTP layer), not the vocabulary tables it
    shares with the target: a sync that checked none of those checked nothing of the draft."""
    return sum(_split_rank(k[len(DRAFT):])[0] not in SHARED for k in mirrors)


def unmirrored(actual: dict[str, str]) -> list[str]:
    """The draft runner's parameters that mirror no tensor of the target's (a draft labkit cannot check): the
    check fails on them. One whose target tensor a sync left out (`exclude`) is unverified like that tensor."""
    return sorted(k for k in actual if k.startswith(DRAFT) and target_name(k[len(DRAFT):]) not in actual)
