"""Per-request sampling seeds on SGLang's CPU engine: identical rollouts for identical (seed, weights).

SGLang 0.5.23 has a seeded sampler (`multinomial_with_seed`: Gumbel-max with noise hashed from the request's
`sampling_seed`, the token position and the vocabulary index), but on CPU it stays off twice over:
  1. `SamplingBatchInfo.from_schedule_batch` fills the seed tensor only under `enable_deterministic_inference`,
     which the CPU attention backends refuse (not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES), so a request's
     `sampling_seed` is silently ignored;
  2. the hash it needs on CPU is `torch.ops.sgl_kernel.murmur_hash32_cpu`, a kernel of the source-only CPU
     build of sgl_kernel, absent from labkit's import-only placeholder.
Without both, arms of an experiment that share one engine get different rollouts at equal weights (the MTP
experiment's step-0 rewards differed 0.668 / 0.691 / 0.637). `register_kernel` provides (2) as the same
MurmurHash3 mix in torch integer ops (bit for bit the Triton kernel's arithmetic; int64 products wrap, and
only their low 32 bits are kept); `patch_sampling_seeds` provides (1): every batch carries a seed tensor,
the request's `sampling_seed` where given, else a fresh draw from torch's generator (which SGLang seeds from
its `random_seed`), so unseeded requests keep sampling as before. Both are on only where no CUDA device is
present. On GPU SGLang honours `sampling_seed` only under `--enable-deterministic-inference` (EngineConfig's
SGLang kwargs): without it seeded requests are sampled freshly there, and the MTP experiment's
`mtp/rollouts_identical_*` checks show it.

Limit: SGLang's seeded top-k/top-p path asserts on min_p > 0 (its own TODO); labkit's requests set none.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_PATCHED = "_labkit_seeded"


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _rotl((k * 0xCC9E2D51) & _M32, 15)
    k = (k * 0x1B873593) & _M32
    h = _rotl(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _M32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def murmur_hash32(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """[n] seeds (64-bit), [n] positions, [m] column indices -> [n, m] 32-bit hashes (int64 holding uint32),
    SGLang's `murmur_hash32_kernel`: blocks seed_low, seed_high, position, column; length 16; fmix32."""
    s = seed.to(torch.int64)[:, None]
    pos = positions.to(torch.int64)[:, None] & _M32
    col = col_indices.to(torch.int64)[None, :] & _M32
    h = _mix(torch.zeros_like(s), s & _M32)
    h = _mix(h, (s >> 32) & _M32)
    h = _mix(h, pos)
    h = _mix(h.expand(-1, col.shape[1]), col.expand(s.shape[0], -1))
    return _fmix(h ^ 16)


_lib = None


def register_kernel() -> bool:
    """Define `torch.ops.sgl_kernel.murmur_hash32_cpu` (idempotent; False when it already exists, e.g. from a
    real CPU build of sgl_kernel, which then wins)."""
    global _lib
    try:
        torch.ops.sgl_kernel.murmur_hash32_cpu.default  # noqa: B018
        return False
    except (AttributeError, RuntimeError):
        pass
    _lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    _lib.define("murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor")
    _lib.impl("murmur_hash32_cpu", murmur_hash32, "CPU")
    return True


def patch_sampling_seeds() -> bool:
    """Make SGLang's batches carry per-request seeds without deterministic inference (idempotent)."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    current = SamplingBatchInfo.__dict__["from_schedule_batch"].__func__
    if getattr(current, _PATCHED, False):
        return False

    def from_schedule_batch(cls, batch, vocab_size):
        info = current(cls, batch, vocab_size)
        if info.sampling_seed is None:  # not deterministic inference: SGLang left the seeds out
            seeds = [r.sampling_params.sampling_seed for r in batch.reqs]
            fresh = torch.randint(0, 2**62, (len(seeds),)).tolist()
            info.sampling_seed = torch.tensor([s if s is not None else f for s, f in zip(seeds, fresh)],
                                              dtype=torch.int64).to(batch.device)
        return info

    setattr(from_schedule_batch, _PATCHED, True)
    SamplingBatchInfo.from_schedule_batch = classmethod(from_schedule_batch)
    return True

