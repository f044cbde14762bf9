"""Rollouts: completions sampled from the engine for a task's problems, with log-probs, scored by the task.

The one place a rollout is written: the workbench's `rollout` (one sample per problem, with metrics) and the RL
step's (a group of samples per problem, per-request sampling seeds: labkit.mtp.rl) both call it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["rollout"]


def rollout(engine, task, problems: Sequence, sampling: dict | list[dict]) -> list[dict]:
    """One completion per problem from `engine` (an EngineHandle), with its per-token log-probs and the task's reward.

    `task`: a labkit.tasks.Task (its tokenizer encodes the prompts, its reward scores the completions); `problems`:
    one per completion (repeat a problem for several samples of it); `sampling`: SGLang sampling params, one dict
    for every request or a list of one per problem. Rows, in order: problem, prompt, completion, reward,
    weight_version, prompt_ids, tokens, logprobs.
    """
    ids = [task.tokenizer.encode(p.prompt) for p in problems]
    outs = engine.generate(input_ids=ids, return_logprob=True, sampling=sampling)
    return [{"problem": p, "prompt": p.prompt, "completion": o["text"], "reward": float(task.reward(p, o["text"])),
             "weight_version": o["meta_info"].get("weight_version"), "prompt_ids": i, "tokens": o["tokens"],
             "logprobs": o["logprobs"]} for p, i, o in zip(problems, ids, outs)]
