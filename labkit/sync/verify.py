"""Bitwise verification of a sync: per-tensor checksums, trainer side vs engine side.

The engine hashes its own parameters in its own layout (SGLang's weight checker: with labkit's model classes xxh3-64 of
the raw bytes on CPU and labkit's device hash on GPU, else SGLang's sha256 and its kernel; labkit.engine.checksum says
why), q/k/v fused in `qkv_proj` and gate/up in `gate_up_proj` (labkit.engine.contract's fused groups). The trainer side
rebuilds that layout from the HF tensors it sent and hashes the same way: 64 bits per tensor cross the wire.
`verify="full"` instead fetches every HF-named tensor back from the engine and compares element-wise.
"""

from __future__ import annotations

import torch

from labkit.engine import checksum as ck
from labkit.engine import draft
from labkit.engine.contract import NONE, engine_shape, fused_part, standalone
from labkit.engine.shard import Sharding, rank_key

ONE = Sharding()  # an engine at tp 1: every tensor whole

# Private metrics key: the engine's checksums read by verification, handed to the atomic guard (its "after")
# so the whole model is not hashed twice per sync; `sync()`/`stream()` drop it before returning.
ENGINE_CHECKSUMS = "_engine_checksums"


def tensor_checksum(t: torch.Tensor, algo: str = ck.DEFAULT) -> str:
    """One tensor's checksum as the engine's weight checker prints it (`algo`: the one the engine runs,
    `EngineHandle.checksum_algo`)."""
    if t.is_cuda and algo == "sha256":  # SGLang's own checker (a foreign engine) hashes with its kernel
        from sglang.srt.managers.mm_utils import tensor_hash  # SGLang is crossed here only (never run: no GPU)

        return f"{tensor_hash(t.contiguous()):016x}"
    return ck.checksum(t, algo)


def padded(name: str, t: torch.Tensor, ffn_pad: int = 1, tp: int = 1) -> torch.Tensor:
    """`t` as the engine's parameter holds it (labkit.engine.contract.engine_shape): a vocabulary table with the
    engine's zero padding rows appended, an FFN block padded with zeros to the engine's width (a CPU engine's
    multiple of 32 * tp), so the padding is checked to be zero; any other tensor unchanged."""
    shape = engine_shape(name, tuple(t.shape), ffn_pad, tp)
    if shape == tuple(t.shape):
        return t
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def on_ranks(name: str, t: torch.Tensor, ffn_pad: int = 1, sharding: Sharding = ONE) -> list[torch.Tensor]:
    """`t` as each engine rank holds it: padded as the engine pads it (`padded`), then each rank's piece
    (labkit.engine.shard); one tensor at tp 1."""
    t = padded(name, t, ffn_pad, sharding.tp)
    return [t if p is None else t.narrow(*p) for p in sharding.pieces(name, tuple(t.shape))]


def engine_layout(named: dict[str, torch.Tensor], ffn_pad: int = 1, sharding: Sharding = ONE
                  ) -> dict[str, torch.Tensor]:
    """HF names -> the engine's parameters, per rank (`rank_key`): fused groups, padded vocabulary and FFN."""
    fused: dict[str, dict[int, torch.Tensor]] = {}  # key -> {index: part}
    out, alone, tp = {}, standalone(named), sharding.tp
    for name, t in named.items():
        part = fused_part(name, alone)
        for r, piece in enumerate(on_ranks(name, t, ffn_pad, sharding)):
            if part is None:
                out[rank_key(name, r, tp)] = piece
            else:
                fused.setdefault(rank_key(part[0], r, tp), {})[part[1]] = piece
    return out | {key: _joined(parts) for key, parts in fused.items()}


def expected_checksums(named: dict[str, torch.Tensor], ffn_pad: int = 1, algo: str = ck.DEFAULT,
                       sharding: Sharding = ONE) -> dict[str, str]:
    return {n: tensor_checksum(t, algo) for n, t in engine_layout(named, ffn_pad, sharding).items()}


class Expected:
    """Trainer-side checksums accumulated bucket by bucket. A fused parameter is hashed once all its parts have been
    seen: per-tensor syncs send q, k and v separately, and a layer's experts (hundreds of slices, larger than a bucket
    on a real MoE) arrive over several buckets. The hash is a running one (xxh3 or sha256) fed the parts in index order,
    so only parts that arrive ahead of their turn are copied (flat buffers are reused for the next bucket); on a device
    the parts are copied and hashed at the end (neither SGLang's device hash nor labkit's, which algorithm "device" runs
    on every tensor, is incremental: `ck.whole`). `ffn_pad`: the engine's FFN padding (`padded`). `sizes`: parts per
    fused parameter (`labkit.engine.contract.part_counts` over the plan's names), needed for experts, whose count is not
    in their names. `algo`: the engine checker's hash (labkit.engine.checksum). `alone`: the plan's
    `labkit.engine.contract.standalone` names (fused by name, loaded alone in this model). `sharding`: the
    engine's TP (labkit.engine.shard): at tp > 1 every rank's piece is hashed under its `rank_key`."""

    def __init__(self, sizes: dict[str, int] | None = None, ffn_pad: int = 1, algo: str = ck.DEFAULT,
                 alone: frozenset[str] = NONE, sharding: Sharding = ONE):
        ck.check_algo(algo)  # an unknown algorithm is refused here, before the first bucket
        self.checksums: dict[str, str] = {}
        self.sizes, self.ffn_pad, self.algo, self.alone = dict(sizes or {}), ffn_pad, algo, alone
        self.sharding = sharding
        self._parts: dict[str, dict[int, torch.Tensor]] = {}  # parts held until their turn
        self._streams: dict[str, list] = {}  # key -> [running hash, next index]

    def add(self, named: dict[str, torch.Tensor]) -> None:
        tp = self.sharding.tp
        for name, t in named.items():
            part, pieces = fused_part(name, self.alone), on_ranks(name, t, self.ffn_pad, self.sharding)
            for r, piece in enumerate(pieces):
                if part is None:  # a replicated tensor (the same object on every rank) is hashed once
                    same = r and piece is pieces[0]
                    self.checksums[rank_key(name, r, tp)] = (self.checksums[rank_key(name, 0, tp)] if same
                                                             else tensor_checksum(piece, self.algo))
                else:
                    self._add_part(name, rank_key(part[0], r, tp), part, piece)

    def _add_part(self, name: str, key: str, part: tuple, t: torch.Tensor) -> None:
        """Part `part[1]` of fused parameter `key` (a rank's, at tp > 1): hashed in index order."""
        _, idx, size = part
        size = self.sizes.get(part[0], size)
        if size is None:
            raise ValueError(f"cannot verify {name!r}: how many tensors fill {part[0]!r} is unknown "
                             "(Expected(sizes=part_counts(plan names)))")
        parts = self._parts.setdefault(key, {})
        whole = ck.whole(t, self.algo)
        stream = self._streams.setdefault(key, [None if whole else ck.new(self.algo), 0])
        if whole or idx != stream[1]:
            parts[idx] = t.detach().clone()
        else:
            _feed(stream, t)
        while not whole and stream[1] in parts:
            _feed(stream, parts.pop(stream[1]))
        if whole and len(parts) == size:
            self.checksums[key] = tensor_checksum(_joined(parts), self.algo)
        elif stream[1] == size:
            self.checksums[key] = ck.digest(stream[0], self.algo)
        else:
            return
        del self._parts[key], self._streams[key]

    def finish(self) -> dict[str, str]:
        """The checksums; a group still incomplete is hashed over the parts it got, in index order (as
        `engine_layout` would), so it can only mismatch the engine's full parameter."""
        for key, parts in self._parts.items():
            stream = self._streams[key]
            if any(ck.whole(t, self.algo) for t in parts.values()):
                self.checksums[key] = tensor_checksum(_joined(parts), self.algo)
                continue
            for i in sorted(parts):
                _feed(stream, parts[i])
            self.checksums[key] = ck.digest(stream[0], self.algo)
        self._parts, self._streams = {}, {}
        return self.checksums


def _joined(parts: dict[int, torch.Tensor]) -> torch.Tensor:
    return torch.cat([parts[i] for i in sorted(parts)], dim=0)


def _feed(stream: list, t: torch.Tensor) -> None:
    ck.feed(stream[0], t)
    stream[1] += 1


def with_draft(expected: dict[str, str], actual: dict[str, str]) -> dict[str, str]:
    """`expected` plus the draft runner's copies of it, where `actual` (an engine's checksums) has a draft runner."""
    return expected | draft.mirrored(expected, actual)


def compare(expected: dict[str, str], actual: dict[str, str], draft_runner: bool = False) -> dict:
    """Every expected tensor must be present on the engine with the same checksum; on a speculative engine the
    draft runner's copies too (labkit.engine.draft), and a draft parameter no synced tensor mirrors fails it.
    `draft_runner`: the engine was started with one, so a reply without its `draft.` checksums fails too (a
    runner whose checker answered nothing would otherwise pass unchecked). `verify/draft_checked` counts the draft
    runner's own parameters checked (not the vocabulary tables it shares with the target)."""
    mirrors = draft.mirrored(expected, actual)
    unchecked = draft.unmirrored(actual) if mirrors else []
    if draft_runner and not any(k.startswith(draft.DRAFT) for k in actual):
        unchecked = [f"{draft.DRAFT}* (the engine reported no draft runner checksums)"]
    expected = expected | mirrors
    missing = sorted(n for n in expected if n not in actual)
    mismatched = sorted(n for n in expected if n in actual and actual[n] != expected[n])
    return {"sync/verified": not missing and not mismatched and not unchecked, "verify/num_checked": len(expected),
            "verify/missing": missing[:20], "verify/mismatched": mismatched[:20],
            "verify/draft_checked": draft.own(mirrors), "verify/draft_unchecked": unchecked[:20]}


def compare_full(named: dict[str, torch.Tensor], fetch) -> dict:
    """Element-wise comparison; `fetch(name)` returns the engine's HF-named tensor."""
    mismatched = []
    for name, t in named.items():
        got = fetch(name)
        if got is None or tuple(got.shape) != tuple(t.shape) or not torch.equal(got.to(t.dtype), t.cpu()):
            mismatched.append(name)
    return {"sync/verified": not mismatched, "verify/num_checked": len(named), "verify/missing": [],
            "verify/mismatched": mismatched[:20]}
