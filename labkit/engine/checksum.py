"""Per-tensor checksums: the same bytes hashed the same way by the trainer (labkit.sync.verify) and by the engine's
weight checker (SGLang's `check_weights`), so only 64 bits per tensor cross the wire.

Why not SGLang's CPU hash: its weight checker hashes a CPU tensor with sha256 (`mm_utils.tensor_hash`, one
core, a cryptographic hash), a device tensor with its own non-cryptographic kernel. A guarded, verified sync
hashes the whole model up to three times (the trainer's expectation, the engine after the sync, the engine
before it for the guard, answered from the engine's memo where nothing wrote in between:
labkit.engine.inside.checkmemo), so the hash rate bounds a verified sync (`bench/phases_end_to_end`).
xxh3-64 (the `xxhash` package SGLang itself depends on) is a non-cryptographic hash several times faster than
sha256 on a CPU core. Like SGLang's device hash it guards against accidents (a wrong offset, a stale slice, a bucket
that never landed), not an adversary: trainer and engine are one trust domain. Both values are 64 bits (sha256's first 8
bytes), so the chance that a changed tensor keeps its checksum is 2^-64 either way.

labkit's model classes install it in SGLang's checker (`labkit.engine.inside.sglang_models.weights.install_checksum`)
and say so when asked (`CHECKSUM_NAME`); an engine without them (a foreign server, SGLang's own model classes)
keeps sha256 and the trainer hashes with that (`EngineHandle.checksum_algo`). An xxh3 value reads
`xxh3:<16 hex>`: two sides that disagree on the algorithm fail verification as such, never by coincidence.

On a GPU, labkit's checker hashes device tensors with labkit's own `device_checksum` (torch alone, no copy to the
host), on both sides: before, the trainer imported much of SGLang for its one hash kernel and the engine ran it,
so a trainer without SGLang (the GPU data path with torch alone) could not verify at all. The same function runs
on CPU tensors as algorithm "device", so the CPU box exercises the code a GPU sync runs (`labkit bench device`).
"""

from __future__ import annotations

import hashlib
from typing import Literal

import torch
import xxhash

Algo = Literal["xxh3_64", "sha256", "device"]
ALGOS: tuple[str, ...] = ("xxh3_64", "sha256", "device")
# "xxh3_64": labkit's checker (xxh3 on CPU tensors, `device_checksum` on CUDA ones); "sha256": SGLang's own
# (sha256 on CPU, its kernel on CUDA); "device": `device_checksum` for every tensor (tests, the CPU device bench)
DEFAULT: Algo = "xxh3_64"
PREFIX = "xxh3:"
DEVICE_PREFIX = "lkdev:"
# get_weights_by_name(CHECKSUM_NAME) -> [[1, memo hits, memo on]] when the engine's checker hashes CPU tensors with
# xxh3 (labkit's models; the memo: labkit.engine.inside.checkmemo)
CHECKSUM_NAME = "labkit.apply/checksum"


def check_algo(algo: str) -> str:
    if algo not in ALGOS:
        raise ValueError(f"checksum algorithm {algo!r} is not one of {ALGOS}")
    return algo


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


def whole(t: torch.Tensor, algo: str = DEFAULT) -> bool:
    """Whether `t` is hashed in one piece by `device_checksum` (not fed into a running host hash)."""
    return t.is_cuda or algo == "device"


# Words per chunk of `device_checksum`: its int64 temporaries are 8x a chunk's words in bytes (512 MiB each),
# bounded whatever the tensor (a 1.2 GB vocabulary table would otherwise need ~10 GB of them).
CHUNK_WORDS = 1 << 26
_K0, _K1, _K2 = -7046029254386353131, -4658895280553007687, -7723592293110705685  # odd 64-bit mixing constants


def device_checksum(t: torch.Tensor) -> str:
    """labkit's hash of `t`'s raw bytes where it lives (torch only: a GPU tensor never leaves the device).

    The bytes, zero-padded to 4, are read as 32-bit words w_i; each is mixed with its position, x_i = w_i ^
    (i * K0), through a bijection of 64 bits (multiply by an odd constant, xor-shift, twice), and the sum of
    the x_i mod 2^64 (order-free, so the same on any device, in any reduction order) is mixed with the byte
    count. A change of one word always changes the sum (each step is a bijection); a change of several keeps it
    with probability about 2^-64: it guards against accidents (a wrong offset, a stale slice), not an adversary,
    like SGLang's device hash. Integer overflow wraps in torch on CPU and CUDA alike."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    n = flat.numel()
    if n % 4:
        flat = torch.cat([flat, flat.new_zeros(4 - n % 4)])
    words = flat.view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, words.numel(), CHUNK_WORDS):
        w = words[start:start + CHUNK_WORDS]
        x = torch.arange(start, start + w.numel(), dtype=torch.int64, device=flat.device)
        x.mul_(_K0).bitwise_xor_(w.to(torch.int64).bitwise_and_(0xFFFFFFFF))
        x.mul_(_K1)
        x.bitwise_xor_(x.bitwise_right_shift(31).bitwise_and_(0x1FFFFFFFF))
        x.mul_(_K2)
        x.bitwise_xor_(x.bitwise_right_shift(29).bitwise_and_(0x7FFFFFFFF))
        total += x.sum()
    h = (int(total.item()) ^ (n * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & 0xFFFFFFFFFFFFFFFF
    return f"{DEVICE_PREFIX}{h ^ (h >> 33):016x}"


def checksum(t: torch.Tensor, algo: str = DEFAULT) -> str:
    """One tensor's checksum as labkit's checker computes it, on either side: labkit's device hash for a CUDA
    tensor (and for any tensor under algorithm "device"), else the host hash `algo` names. SGLang's own device
    hash (algorithm "sha256" on a CUDA tensor: a foreign engine) is the caller's (labkit.sync.verify)."""
    if whole(t, check_algo(algo)):
        return device_checksum(t)
    return cpu_checksum(t, algo)
