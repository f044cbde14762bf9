"""labkit.compat.seeded: the CPU murmur hash is MurmurHash3's arithmetic (checked against a Python-int reference
that cannot overflow), and the seeded Gumbel-max sample it drives is a sample of the distribution."""

import random

import pytest
import torch

from labkit.compat import seeded

M = 0xFFFFFFFF


def _ref(seed: int, pos: int, col: int) -> int:
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & M

    def mix(h, k):
        k = rotl((k * 0xCC9E2D51) & M, 15)
        k = (k * 0x1B873593) & M
        h = rotl(h ^ k, 13)
        return (h * 5 + 0xE6546B64) & M

    h = 0
    for k in (seed & M, (seed >> 32) & M, pos & M, col & M):
        h = mix(h, k)
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    return h ^ (h >> 16)


@pytest.mark.parametrize("trial", range(5))
def test_murmur_matches_the_python_reference(trial):
    rng = random.Random(trial)
    seeds = [rng.getrandbits(62) for _ in range(4)] + [0]
    pos = [rng.randrange(0, 5000) for _ in seeds]
    cols = list(range(0, 300, 7))
    got = seeded.murmur_hash32(torch.tensor(seeds), torch.tensor(pos), torch.tensor(cols))
    want = [[_ref(s, p, c) for c in cols] for s, p in zip(seeds, pos)]
    assert got.tolist() == want
    assert int(got.min()) >= 0 and int(got.max()) <= M


def test_registered_op_is_the_function():
    seeded.register_kernel()
    s, p, c = torch.tensor([3, 2**40 + 5]), torch.tensor([1, 9]), torch.arange(64)
    assert torch.equal(torch.ops.sgl_kernel.murmur_hash32_cpu.default(s, p, c), seeded.murmur_hash32(s, p, c))


def test_seeded_gumbel_sample_follows_the_distribution_and_repeats():
    """SGLang's multinomial_with_seed on these hashes: same (seed, position) -> same token; over many seeds the
    frequencies match the probabilities (a wrong hash, e.g. constant in the column, would pick one token)."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    n = 20000
    seeds = torch.arange(n) * 7919 + 13
    h = seeded.murmur_hash32(seeds, torch.full((n,), 11), torch.arange(4)).to(torch.float64) / M
    g = -torch.log(-torch.log(h.clamp(1e-12, 1 - 1e-12)))
    pick = (probs.log()[None] + g).argmax(-1)
    freq = torch.bincount(pick, minlength=4).double() / n
    assert torch.allclose(freq, probs, atol=0.015), freq
    again = seeded.murmur_hash32(seeds[:10], torch.full((10,), 11), torch.arange(4))
    assert torch.equal(again, seeded.murmur_hash32(seeds[:10], torch.full((10,), 11), torch.arange(4)))
