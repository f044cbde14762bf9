"""The arithmetic task: prompt "37+45=", answer "82", reward 1 for the exact answer. Pure Python.

`ArithTask` is labkit's default `Task` (labkit.tasks.base); the module-level functions are the same task for
code that works on `Problem`s directly (pretraining, tests).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from labkit.config import check
from labkit.tasks.base import CharTokenizer, Tokenizer, pad_batch, prompt_and_target


@dataclass(frozen=True, slots=True)
class Problem:
    prompt: str
    answer: str


MAX_OPERAND = 49  # 2,500 problems: the tiny model learns them all, so RL's room is its sampling noise
CHAR = CharTokenizer()


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
    tokenizer: Tokenizer = field(default_factory=CharTokenizer)
    max_new_tokens: int = 5  # "98" + EOS fits with room: longer answers are wrong anyway

    def __post_init__(self) -> None:
        check(isinstance(self.max_operand, int) and self.max_operand >= 0, "max_operand", self.max_operand,
              "an integer >= 0")
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, "max_new_tokens",
              self.max_new_tokens, "an integer >= 1")

    def problems(self, n: int, seed: int = 0) -> list[Problem]:
        return problems(n, seed=seed, max_operand=self.max_operand)

    def reward(self, problem: Problem, completion: str) -> float:
        return reward(problem, completion)

    def batch(self, items: list[Problem]):
        return batch(items, self.tokenizer)
