"""The long-answer task: a Fibonacci chain modulo 100, worked step by step. Prompt "07,10:", answer 15 steps,
each the two previous terms and their sum modulo 100, two digits each: "07+10=17;10+17=27;17+27=44;..."
(134 characters, then EOS).

Why this task: RL rollouts run to thousands of tokens and a draft's acceptance can change along a generation
(Test-Time Speculation, arXiv 2605.09329); the arithmetic task's answers are 3 tokens. Each step is the
arithmetic task's "a+b=" with its operands copied from just before, so the tiny model learns it; its MTP draft
(one layer, the token after next) gets the copies and separators nearly free and must compute the sums, and a
wrong sum is copied into every later step: acceptance varies within a step and, as errors compound, along the
answer.

The held-out set is whole orbits of the map (a, b) -> (b, a + b mod 100): a training chain starts outside them
and so never contains a held-out pair of consecutive terms, anywhere in it (not only as its prompt).
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field

from labkit.config import check
from labkit.tasks.base import CharTokenizer, Tokenizer, pad_batch, prompt_and_target

MOD = 100
TERMS = 15  # steps of 9 characters ("07+10=17;"), the last without ";": 134 characters, at least 128
HELD_OUT = 300  # pairs in the held-out orbits (about 3 % of the 10,000)
HELD_OUT_SEED = 20_261_129  # fixed: the held-out orbits are part of the task's definition


@dataclass(frozen=True, slots=True)
class Problem:
    prompt: str
    answer: str


def step(a: int, b: int) -> tuple[int, int]:
    return b, (a + b) % MOD


def terms(a: int, b: int, n: int = TERMS) -> list[int]:
    """The n terms after a, b."""
    out = []
    for _ in range(n):
        a, b = step(a, b)
        out.append(b)
    return out


def render(a: int, b: int, values: list[int]) -> Problem:
    """The problem whose answer works `values` (each the sum the step writes) out from a, b."""
    prev, steps = [a, b], []
    for v in values:
        steps.append(f"{prev[-2]:02d}+{prev[-1]:02d}={v:02d}")
        prev.append(v)
    return Problem(f"{a:02d},{b:02d}:", ";".join(steps))


def sums(answer: str) -> list[int]:
    """The sums a well-formed answer writes, in order."""
    return [int(step.split("=")[1]) for step in answer.split(";")]


@functools.lru_cache(maxsize=1)
def orbits() -> tuple[tuple[tuple[int, int], ...], ...]:
    """Every orbit of the pair map, each in visiting order from its smallest pair: they partition the 10,000
    pairs (lengths 1 to 300)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for a in range(MOD):
        for b in range(MOD):
            orbit, p = [], (a, b)
            while p not in seen:
                seen.add(p)
                orbit.append(p)
                p = step(*p)
            if orbit:
                out.append(tuple(orbit))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def held_out_pairs() -> tuple[tuple[int, int], ...]:
    """The held-out pairs: whole orbits drawn by a seeded shuffle until HELD_OUT pairs, in a seeded order."""
    chosen: list[tuple[int, int]] = []
    pool = list(orbits())
    random.Random(HELD_OUT_SEED).shuffle(pool)
    for orbit in pool:
        if len(chosen) + len(orbit) <= HELD_OUT:
            chosen += orbit
    random.Random(HELD_OUT_SEED + 1).shuffle(chosen)
    return tuple(chosen)


def held_out_digest() -> str:
    """16 hex chars naming the held-out set (a checkpoint's pretrain.json records it)."""
    text = ";".join(f"{a},{b}" for a, b in sorted(held_out_pairs()))
    return hashlib.sha256(f"chain{TERMS};{text}".encode()).hexdigest()[:16]


def problems(n: int, seed: int = 0) -> list[Problem]:
    """n training chains, their first pair drawn uniformly outside the held-out orbits (seeded)."""
    check(isinstance(n, int) and n >= 1, "n", n, "an integer >= 1")
    skip = frozenset(held_out_pairs())
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        a, b = rng.randrange(MOD), rng.randrange(MOD)
        if (a, b) not in skip:
            out.append(render(a, b, terms(a, b)))
    return out


def evaluation(n: int) -> list[Problem]:
    """The first n held-out chains (fixed order): no training chain contains any of their pairs."""
    pairs = held_out_pairs()
    check(isinstance(n, int) and 1 <= n <= len(pairs), "n", n, f"an integer in [1, {len(pairs)}] (the held-out size)")
    return [render(a, b, terms(a, b)) for a, b in pairs[:n]]


def reward(problem: Problem, completion: str) -> float:
    """The fraction of the answer's steps the completion writes exactly (operands and sum) before its first wrong
    one: a chain is only as good as its first error, since every later step is computed from the ones before.
    Stops at the first newline."""
    want, got = problem.answer.split(";"), completion.split("\n")[0].split(";")
    good = 0
    for w, g in zip(want, got):
        if w != g:
            break
        good += 1
    return good / len(want)


def corrupt(items: list[Problem], rate: float, seed: int = 0) -> list[Problem]:
    """Each sum replaced, with probability `rate`, by a different random value, and the chain continued from it
    (later steps copy it): a consistent noisy corpus (every sum is the rule's or a slip), so the pretrained policy
    slips at T=1 about that often and RL has errors to remove."""
    check(isinstance(rate, (int, float)) and 0 <= rate < 1, "rate", rate, "a float in [0, 1)")
    rng = random.Random(seed)
    out = []
    for p in items:
        a, b = (int(x) for x in p.prompt.rstrip(":").split(","))
        values = []
        for _ in range(len(p.answer.split(";"))):
            a, b = step(a, b)
            if rng.random() < rate:
                b = rng.choice([v for v in range(MOD) if v != b])
            values.append(b)
        out.append(render(int(p.prompt[:2]), int(p.prompt[3:5]), values))
    return out


@dataclass(frozen=True, slots=True)
class ChainTask:
    """"07,10:" -> 15 worked steps of the Fibonacci chain mod 100 (134 characters); reward: the correct prefix's
    share of the steps."""

    tokenizer: Tokenizer = field(default_factory=CharTokenizer)
    max_new_tokens: int = 136  # 134 characters + EOS, and one to spare

    def __post_init__(self) -> None:
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, "max_new_tokens",
              self.max_new_tokens, "an integer >= 1")

    def problems(self, n: int, seed: int = 0) -> list[Problem]:
        return problems(n, seed=seed)

    def evaluation(self, n: int) -> list[Problem]:
        return evaluation(n)

    def evaluation_digest(self) -> str:
        return held_out_digest()

    def evaluation_size(self) -> int:
        return len(held_out_pairs())

    def reward(self, problem: Problem, completion: str) -> float:
        return reward(problem, completion)

    def corrupt(self, items: list[Problem], rate: float, seed: int = 0) -> list[Problem]:
        return corrupt(items, rate, seed)

    def batch(self, items: list[Problem]):
        return pad_batch([prompt_and_target(self.tokenizer, p.prompt, p.answer) for p in items],
                         self.tokenizer.pad_token_id)
