"""Bitwise verification of a sync: per-tensor checksums, trainer side vs engine side.

The engine hashes its own parameters (SGLang's weight checker: sha256 of the raw bytes, first 8 bytes), in its
own layout, where q/k/v live fused in `qkv_proj` and gate/up in `gate_up_proj` (labkit.engine.contract's fused
groups). The trainer side rebuilds that layout from the HF tensors it sent and hashes the same way, so only 16
hex characters per tensor cross the wire. `full=True` instead fetches every HF-named tensor back from the
engine and compares element-wise.
"""

from __future__ import annotations

import hashlib

import torch

from labkit.engine.contract import engine_rows, fused_part


def tensor_checksum(t: torch.Tensor) -> str:
    """SGLang's tensor_hash for one tensor, as the weight checker prints it."""
    if t.is_cuda:  # SGLang hashes device tensors with its own kernel, not sha256 (untested here: no GPU)
        from sglang.srt.managers.mm_utils import tensor_hash

        return f"{tensor_hash(t.contiguous()):016x}"
    t = t.detach().cpu().contiguous()
    digest = hashlib.sha256(memoryview(t.reshape(-1).view(torch.uint8).numpy())).digest()[:8]
    return f"{int.from_bytes(digest, 'big'):016x}"


def padded(name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` as the engine's parameter holds it: a vocabulary table with the engine's zero padding rows appended
    (labkit.engine.contract.engine_rows), so the padding is checked to be zero and an odd vocabulary (131)
    hashes like the engine's table; any other tensor unchanged."""
    rows = engine_rows(name, t.shape[0]) if t.dim() else 0
    if rows <= (t.shape[0] if t.dim() else 0):
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))], dim=0)


def engine_layout(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names -> the engine's parameters (TP=1 engine layout: fused groups, padded vocabulary tables)."""
    fused: dict[str, list] = {}
    out = {}
    for name, t in named.items():
        part = fused_part(name)
        if part is None:
            out[name] = padded(name, t)
            continue
        key, idx, _ = part
        fused.setdefault(key, []).append((idx, t))
    for name, parts in fused.items():
        out[name] = torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])], dim=0)
    return out


def expected_checksums(named: dict[str, torch.Tensor]) -> dict[str, str]:
    return {n: tensor_checksum(t) for n, t in engine_layout(named).items()}


class Expected:
    """Trainer-side checksums accumulated bucket by bucket. A fused group is hashed once all its parts have
    been seen (per-tensor syncs send q, k and v separately); incomplete parts are copied, since flat buffers
    are reused for the next bucket."""

    def __init__(self):
        self.checksums: dict[str, str] = {}
        self._parts: dict[str, dict[int, torch.Tensor]] = {}

    def add(self, named: dict[str, torch.Tensor]) -> None:
        for name, t in named.items():
            part = fused_part(name)
            if part is None:
                self.checksums[name] = tensor_checksum(padded(name, t))
                continue
            key, idx, size = part
            parts = self._parts.setdefault(key, {})
            parts[idx] = t
            if len(parts) == size:
                self.checksums[key] = tensor_checksum(torch.cat([parts[i] for i in sorted(parts)], dim=0))
                del self._parts[key]
            else:
                parts[idx] = t.detach().clone()

    def finish(self) -> dict[str, str]:
        for key, parts in self._parts.items():  # an incomplete group can only mismatch: report it as such
            self.checksums[key] = tensor_checksum(torch.cat([parts[i] for i in sorted(parts)], dim=0))
        self._parts = {}
        return self.checksums


def compare(expected: dict[str, str], actual: dict[str, str]) -> dict:
    """Every expected tensor must be present on the engine with the same checksum."""
    missing = sorted(n for n in expected if n not in actual)
    mismatched = sorted(n for n in expected if n in actual and actual[n] != expected[n])
    return {"sync/verified": not missing and not mismatched, "verify/num_checked": len(expected),
            "verify/missing": missing[:20], "verify/mismatched": mismatched[:20]}


def compare_full(named: dict[str, torch.Tensor], fetch) -> dict:
    """Element-wise comparison; `fetch(name)` returns the engine's HF-named tensor."""
    mismatched = []
    for name, t in named.items():
        got = fetch(name)
        if got is None or tuple(got.shape) != tuple(t.shape) or not torch.equal(got.to(t.dtype), t.cpu()):
            mismatched.append(name)
    return {"sync/verified": not mismatched, "verify/num_checked": len(named), "verify/missing": [],
            "verify/mismatched": mismatched[:20]}
