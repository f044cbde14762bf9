"""The shipped long-task checkpoint (data/tiny-mimo-chain, `labkit pretrain --task chain`): its record names the
task's held-out set as excluded, and its greedy answers on held-out chains follow the rule for a while, so
acceptance along a generation is measured on answers that mean something."""

import json
from pathlib import Path

import torch

from labkit.models.tiny import default_model_dir
from labkit.mtp.experiment import checkpoint_held_out
from labkit.mtp.speculative import Speculator
from labkit.tasks import ChainTask

CKPT = Path(default_model_dir("chain"))


def test_the_checkpoint_records_the_held_out_set_it_never_saw():
    record = json.loads((CKPT / "pretrain.json").read_text())
    assert record["pretrain/task"] == "chain" and record["pretrain/held_out"] == 300
    assert checkpoint_held_out(str(CKPT), ChainTask())
    assert not checkpoint_held_out(default_model_dir("arith"), ChainTask())  # the other checkpoint: another set


def test_greedy_answers_on_held_out_chains_follow_the_rule():
    task, before = ChainTask(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        problems = task.evaluation(16)
        out = Speculator(str(CKPT)).generate([task.tokenizer.encode(p.prompt) for p in problems], k=1,
                                             temperature=0.0, max_new_tokens=task.max_new_tokens, progress=False)
    finally:
        torch.set_num_threads(before)
    rewards = [task.reward(p, task.tokenizer.decode(r["output_ids"])) for p, r in zip(problems, out["requests"])]
    assert sum(rewards) / len(rewards) > 0.5, rewards  # an untrained model writes no correct step (reward 0)
    assert len(out["positions"]["proposed_at"]) >= 135 and out["metrics"]["mtp/accept_rate_at_96_127"] > 0
