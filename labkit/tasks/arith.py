"""The arithmetic task: prompt "37+45=", answer "82", reward 1 for the exact answer. Pure Python.

`ArithTask` is labkit's default `Task` (labkit.tasks.base); the module-level functions are the same task for
code that works on `Problem`s directly (pretraining, tests).
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field

from labkit.config import check
from labkit.tasks.base import CharTokenizer, Tokenizer, pad_batch, prompt_and_target


@dataclass(frozen=True, slots=True)
class Problem:
    prompt: str
    answer: str


MAX_OPERAND = 49  # 2,500 problems: the tiny model learns them all, so RL's room is its sampling noise
HELD_OUT = 256  # problems no training stage ever sees (pretraining, RL prompts): the evaluation set
HELD_OUT_SEED = 20_261_125  # fixed: the held-out set is part of the task's definition, like its operand range
CHAR = CharTokenizer()


def _check_held_out(max_operand: int, held_out: int | None) -> int:
    """The held-out count (None: HELD_OUT, at most a quarter of the problems), or ValueError naming the value."""
    pairs = (max_operand + 1) ** 2
    if held_out is None:
        return min(HELD_OUT, pairs // 4)
    if not (isinstance(held_out, int) and not isinstance(held_out, bool) and 0 <= held_out <= pairs // 2):
        raise ValueError(f"held_out={held_out!r} is invalid: expected an integer in [0, {pairs // 2}] (at most half "
                         f"of the {pairs} problems with operands 0..{max_operand}) or None")
    return held_out


@functools.lru_cache(maxsize=8)
def held_out_pairs(max_operand: int = MAX_OPERAND, held_out: int | None = None) -> tuple[tuple[int, int], ...]:
    """The (a, b) pairs held out of every training stage, in a fixed order: unordered pairs {a, b} drawn by a
    seeded shuffle, each with both orders (a+b and b+a), so no held-out sum is trained as its commuted twin."""
    held_out = _check_held_out(max_operand, held_out)
    unordered = [(a, b) for a in range(max_operand + 1) for b in range(a, max_operand + 1)]
    random.Random(HELD_OUT_SEED).shuffle(unordered)
    out: list[tuple[int, int]] = []
    for a, b in unordered:
        twins = [(a, b)] if a == b else [(a, b), (b, a)]
        if len(out) + len(twins) > held_out:
            continue
        out += twins
        if len(out) == held_out:
            break
    return tuple(out)


def held_out_digest(max_operand: int = MAX_OPERAND, held_out: int | None = None) -> str:
    """16 hex chars naming the held-out set: a checkpoint records it (pretrain.json) so an experiment can check
    that its evaluation problems were kept out of that checkpoint's training."""
    text = ";".join(f"{a}+{b}" for a, b in sorted(held_out_pairs(max_operand, held_out)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def problems(n: int, seed: int = 0, max_operand: int = MAX_OPERAND, held_out: int | None = None) -> list[Problem]:
    """n training problems drawn uniformly from the pairs outside the held-out set (seeded)."""
    if n < 1:
        raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
    skip = frozenset(held_out_pairs(max_operand, held_out))
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if (a, b) not in skip:
            out.append(Problem(f"{a}+{b}=", str(a + b)))
    return out


def evaluation(n: int, max_operand: int = MAX_OPERAND, held_out: int | None = None) -> list[Problem]:
    """The first n held-out problems (fixed order): disjoint from every `problems(...)` draw."""
    pairs = held_out_pairs(max_operand, held_out)
    if not (isinstance(n, int) and 1 <= n <= len(pairs)):
        raise ValueError(f"n={n!r} is invalid: expected an integer in [1, {len(pairs)}] (the held-out set's size)")
    return [Problem(f"{a}+{b}=", str(a + b)) for a, b in pairs[:n]]


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


def sequence(problem: Problem, tokenizer: Tokenizer = CHAR) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + EOS, and a mask that is 1 on the answer/EOS tokens."""
    return prompt_and_target(tokenizer, problem.prompt, problem.answer)


def batch(items: list[Problem], tokenizer: Tokenizer = CHAR):
    """Right-padded token ids [b, s] and the answer mask [b, s] (torch tensors) for supervised steps."""
    return pad_batch([sequence(p, tokenizer) for p in items], tokenizer.pad_token_id)


@dataclass(frozen=True, slots=True)
class ArithTask:
    """"a+b=" -> the sum, exact-answer reward; the task every labkit default (Workbench, RL, MTP experiment) uses."""

    max_operand: int = MAX_OPERAND
    held_out: int | None = None
    """Problems kept out of `problems()` (training) and served by `evaluation()`; None: 256, at most a quarter."""
    tokenizer: Tokenizer = field(default_factory=CharTokenizer)
    max_new_tokens: int = 5  # "98" + EOS fits with room: longer answers are wrong anyway

    def __post_init__(self) -> None:
        check(isinstance(self.max_operand, int) and self.max_operand >= 0, "max_operand", self.max_operand,
              "an integer >= 0")
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, "max_new_tokens",
              self.max_new_tokens, "an integer >= 1")
        _check_held_out(self.max_operand, self.held_out)

    def problems(self, n: int, seed: int = 0) -> list[Problem]:
        return problems(n, seed=seed, max_operand=self.max_operand, held_out=self.held_out)

    def evaluation(self, n: int) -> list[Problem]:
        return evaluation(n, max_operand=self.max_operand, held_out=self.held_out)

    def evaluation_digest(self) -> str:
        return held_out_digest(self.max_operand, self.held_out)

    def evaluation_size(self) -> int:
        return len(held_out_pairs(self.max_operand, self.held_out))

    def reward(self, problem: Problem, completion: str) -> float:
        return reward(problem, completion)

    def corrupt(self, items: list[Problem], rate: float, seed: int = 0) -> list[Problem]:
        return corrupt(items, rate, seed)

    def batch(self, items: list[Problem]):
        return batch(items, self.tokenizer)
