"""Tasks: what the policy is asked (problems with prompts), how a completion is scored (reward), what a
supervised step learns (batch), through one tokenizer. `ArithTask` is the default everywhere."""

from labkit.tasks.arith import ArithTask
from labkit.tasks.base import CharTokenizer, Task, Tokenizer, check_task, pad_batch, prompt_and_target

__all__ = ["ArithTask", "CharTokenizer", "Task", "Tokenizer", "check_task", "pad_batch", "prompt_and_target"]
