"""Per-tensor checksums: the same bytes hashed the same way by the trainer (labkit.sync.verify) and by the engine's
weight checker (SGLang's `check_weights`), so only 64 bits per tensor cross the wire.

Why not SGLang's CPU hash: its weight checker hashes a CPU tensor with sha256 (`mm_utils.tensor_hash`, 1.1 GB/s
on one core of the 2-core box), a device tensor with its own non-cryptographic kernel. A guarded, verified sync
hashes the whole model three times (the trainer's expectation, the engine after the sync, the engine before it
for the guard): on the 0.32 GB bench model that was ~0.75 s of a 0.98 s end-to-end sync, against 0.19 s of
moving the weights (the guard's hash is now answered from the engine's memo where nothing wrote in
between: labkit.engine.checkmemo). xxh3-64 (the `xxhash` package SGLang itself depends on) reads ~11 GB/s.
Like SGLang's device
hash it guards against accidents (a wrong offset, a stale slice, a bucket that never landed), not an adversary:
trainer and engine are one trust domain. Both values are 64 bits (sha256's first 8 bytes), so the chance that a
changed tensor keeps its checksum is 2^-64 either way.

labkit's model classes install it in SGLang's checker (`labkit.engine.sglang_models.weights.install_checksum`)
and say so when asked (`CHECKSUM_NAME`); an engine without them (a foreign server, SGLang's own model classes)
keeps sha256 and the trainer hashes with that (`EngineHandle.checksum_algo`). An xxh3 value reads
`xxh3:<16 hex>`: two sides that disagree on the algorithm fail verification as such, never by coincidence.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import torch
import xxhash

Algo = Literal["xxh3_64", "sha256"]
ALGOS: tuple[str, ...] = ("xxh3_64", "sha256")
DEFAULT: Algo = "xxh3_64"  # what labkit's engines run; "sha256" is SGLang's own CPU checker
PREFIX = "xxh3:"
# get_weights_by_name(CHECKSUM_NAME) -> [[1, memo hits, memo on]] when the engine's checker hashes CPU tensors with
# xxh3 (labkit's models; the memo: labkit.engine.checkmemo)
CHECKSUM_NAME = "labkit.apply/checksum"


def new(algo: str = DEFAULT):
    """A running hash; `feed` tensors into it in order, `digest` once (the same value as one tensor of their
    concatenated bytes)."""
    if algo == "xxh3_64":
        return xxhash.xxh3_64()
    if algo == "sha256":
        return hashlib.sha256()
    raise ValueError(f"checksum algorithm {algo!r} is not one of {ALGOS}")


def feed(h, t: torch.Tensor) -> None:
    """Add `t`'s raw bytes (C order, its own dtype) to the running hash `h`; both hashes release the GIL."""
    h.update(memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))


def digest(h, algo: str = DEFAULT) -> str:
    if algo == "xxh3_64":
        return f"{PREFIX}{h.intdigest():016x}"
    return f"{int.from_bytes(h.digest()[:8], 'big'):016x}"  # SGLang's tensor_hash on a CPU tensor


def cpu_checksum(t: torch.Tensor, algo: str = DEFAULT) -> str:
    """One tensor's checksum, as the engine's checker prints it."""
    h = new(algo)
    feed(h, t)
    return digest(h, algo)
