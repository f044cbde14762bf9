"""What a task is to labkit: problems to prompt with, a reward for a completion, supervised batches, and the
tokenizer all of them go through. The workbench, the RL loop and the MTP experiment take a `Task` object
(default: the arithmetic task), so a new task is a small class, not an edit of the training loop.

Pure: the protocols import nothing heavy; torch only where a batch is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from labkit.models import tokenizer as char


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids without special tokens added; `decode` drops them. HF names, so a thin adapter over a
    `transformers` tokenizer (encode(..., add_special_tokens=False), decode(..., skip_special_tokens=True)) fits."""

    eos_token_id: int
    pad_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@runtime_checkable
class Task(Protocol):
    """A task: `problems(n, seed)` gives n items, each with a `.prompt` string (and whatever `reward` needs,
    e.g. the answer); `reward(problem, completion_text)` scores one completion in [0, 1]; `batch(problems)`
    gives right-padded token ids [b, s] and a loss mask [b, s] (1 on the tokens a supervised step learns);
    `tokenizer` encodes prompts for the engine and the trainer; `max_new_tokens` is a completion's budget.

    Optional: `evaluation(n)`, n held-out problems that no `problems(...)` draw returns, and
    `evaluation_digest()`, a name for that set a checkpoint's pretrain.json can record. Without them an
    experiment evaluates on a seeded draw and reports `mtp/eval_disjoint` False."""

    tokenizer: Tokenizer
    max_new_tokens: int

    def problems(self, n: int, seed: int = 0) -> Sequence[Any]: ...

    def reward(self, problem: Any, completion: str) -> float: ...

    def batch(self, problems: Sequence[Any]) -> tuple[Any, Any]: ...


class CharTokenizer:
    """labkit's character tokenizer (labkit.models.tokenizer, the one `data/tiny-mimo` ships) as an object."""

    eos_token_id = char.EOS
    pad_token_id = char.PAD

    def encode(self, text: str) -> list[int]:
        return char.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return char.decode(list(ids))

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer)

    def __hash__(self) -> int:
        return hash(CharTokenizer)


def pad_batch(seqs: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """(token ids, loss mask) pairs -> right-padded torch tensors [b, s] (pad_id / 0 past each sequence's end)."""
    import torch  # only here: the rest of labkit.tasks stays importable without it

    if not seqs:
        raise ValueError("pad_batch: no sequences: expected at least one (token ids, mask) pair")
    s = max(len(t) for t, _ in seqs)
    tokens = torch.full((len(seqs), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), s), dtype=torch.long)
    for i, (t, m) in enumerate(seqs):
        if len(t) != len(m):
            raise ValueError(f"pad_batch: sequence {i} has {len(t)} token ids but a mask of {len(m)}: expected equal")
        tokens[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.long)
    return tokens, mask


def prompt_and_target(tokenizer: Tokenizer, prompt: str, target: str) -> tuple[list[int], list[int]]:
    """Token ids of prompt + target + EOS, and a mask that is 1 on the target and EOS (what a supervised step
    learns: the answer, not the question)."""
    p, a = tokenizer.encode(prompt), tokenizer.encode(target) + [tokenizer.eos_token_id]
    return p + a, [0] * len(p) + [1] * len(a)


def check_task(task: Any) -> None:
    """TypeError naming what a task object lacks, before any process starts."""
    missing = [a for a in ("problems", "reward", "batch", "tokenizer", "max_new_tokens") if not hasattr(task, a)]
    if missing:
        raise TypeError(f"task={task!r} is invalid: it lacks {', '.join(missing)}; expected a labkit.tasks.Task "
                        "(problems(n, seed), reward(problem, completion), batch(problems), tokenizer, max_new_tokens)")
    tok = task.tokenizer
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"task.tokenizer={tok!r} is invalid: expected a labkit.tasks.Tokenizer "
                        "(encode(text), decode(ids), eos_token_id, pad_token_id)")
