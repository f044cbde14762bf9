"""Tasks: what the policy is asked (problems with prompts), how a completion is scored (reward), what a
supervised step learns (batch), through one tokenizer. `ArithTask` is the default everywhere; `ChainTask` is
the long-answer task (134-character answers)."""

from labkit.tasks.arith import ArithTask
from labkit.tasks.base import CharTokenizer, Task, Tokenizer, check_task, pad_batch, prompt_and_target
from labkit.tasks.chain import ChainTask

TASKS = {"arith": ArithTask, "chain": ChainTask}
"""The tasks a CLI flag or notebook parameter names (`--task`)."""

__all__ = ["ArithTask", "ChainTask", "CharTokenizer", "TASKS", "Task", "Tokenizer", "check_task", "pad_batch",
           "prompt_and_target"]
