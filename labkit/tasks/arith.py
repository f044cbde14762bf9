"""The arithmetic task: prompt "37+45=", answer "82", reward 1 for the exact answer. Pure Python."""

from __future__ import annotations

import random
from dataclasses import dataclass

from labkit.models.tokenizer import EOS, encode


@dataclass(frozen=True, slots=True)
class Problem:
    prompt: str
    answer: str


MAX_OPERAND = 49  # 2,500 problems: the tiny model learns them all, so RL's room is its sampling noise


def problems(n: int, seed: int = 0, max_operand: int = MAX_OPERAND) -> list[Problem]:
    if n < 1:
        raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append(Problem(f"{a}+{b}=", str(a + b)))
    return out


def reward(problem: Problem, completion: str) -> float:
    """1.0 when the completion (up to the first end-of-sequence or newline) is exactly the answer."""
    return float(completion.split("\n")[0].strip() == problem.answer)


def corrupt(items: list[Problem], rate: float, seed: int = 0) -> list[Problem]:
    """Each answer digit replaced, with probability `rate`, by a different random digit: a noisy corpus, so
    the pretrained policy samples wrong answers at T=1 that RL then removes (and its MTP draft learns the noise)."""
    if not 0 <= rate < 1:
        raise ValueError(f"rate={rate!r} is invalid: expected a float in [0, 1)")
    rng = random.Random(seed)

    def flip(d: str) -> str:
        return rng.choice([c for c in "0123456789" if c != d]) if rng.random() < rate else d

    return [Problem(p.prompt, "".join(flip(d) for d in p.answer)) for p in items]


def sequence(problem: Problem) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + EOS, and a mask that is 1 on the answer/EOS tokens."""
    p, a = encode(problem.prompt), encode(problem.answer) + [EOS]
    return p + a, [0] * len(p) + [1] * len(a)


def corpus(n: int, seed: int = 0) -> list[str]:
    """Plain strings for pretraining: one solved problem per line."""
    return [f"{p.prompt}{p.answer}" for p in problems(n, seed)]


def batch(items: list[Problem]):
    """Right-padded token ids [b, s] and the answer mask [b, s] (torch tensors) for supervised steps."""
    import torch

    from labkit.models.tokenizer import PAD

    seqs = [sequence(p) for p in items]
    s = max(len(t) for t, _ in seqs)
    tokens = torch.full((len(seqs), s), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), s), dtype=torch.long)
    for i, (t, m) in enumerate(seqs):
        tokens[i, : len(t)] = torch.tensor(t)
        mask[i, : len(m)] = torch.tensor(m)
    return tokens, mask
