"""The long-answer task (labkit.tasks.chain): 134-character answers, a held-out set no training chain touches
(not even inside a chain), a reward that scores the correct prefix, and a noisy corpus that stays a chain."""

import pytest

from labkit.tasks import ChainTask, Task, check_task, chain


def _values(p):
    a, b = (int(x) for x in p.prompt.rstrip(":").split(","))
    return [a, b] + chain.sums(p.answer)


def test_answers_are_15_worked_steps_of_134_characters_that_follow_the_rule():
    for p in chain.problems(50, seed=3) + chain.evaluation(50):
        values = _values(p)
        assert len(p.answer) == 134 and len(values) == 17
        assert all(values[i] == (values[i - 1] + values[i - 2]) % 100 for i in range(2, 17))
        assert p.answer.split(";")[1] == f"{values[1]:02d}+{values[2]:02d}={values[3]:02d}"  # operands copied
    assert chain.evaluation(1)[0].answer.startswith("21+43=64;43+64=07;")


def test_no_training_chain_contains_a_held_out_pair_anywhere():
    held = set(chain.held_out_pairs())
    assert len(held) == chain.HELD_OUT == ChainTask().evaluation_size()
    for seed in range(20):
        for p in chain.problems(64, seed=seed):
            values = _values(p)
            assert not held & set(zip(values, values[1:])), p
    evals = {p.prompt for p in chain.evaluation(chain.HELD_OUT)}
    assert len(evals) == chain.HELD_OUT  # the check above fails if the split ignored orbits: it can fail


def test_the_held_out_set_is_whole_orbits():
    held = set(chain.held_out_pairs())
    for orbit in chain.orbits():
        assert set(orbit) <= held or not set(orbit) & held
    assert sum(len(o) for o in chain.orbits()) == 10_000


def test_reward_is_the_correct_prefix_share():
    p = chain.evaluation(1)[0]
    steps = p.answer.split(";")
    assert chain.reward(p, p.answer) == 1.0
    assert chain.reward(p, p.answer + "\nmore") == 1.0
    wrong = ";".join(steps[:10] + ["00+00=00"] + steps[11:])
    assert chain.reward(p, wrong) == pytest.approx(10 / 15)
    assert chain.reward(p, ";".join(steps[:3])) == pytest.approx(3 / 15) and chain.reward(p, "") == 0.0


def test_a_corrupted_chain_continues_from_its_slips():
    items = chain.problems(200, seed=1)
    noisy = chain.corrupt(items, 0.05, seed=2)
    slips = 0
    for clean, p in zip(items, noisy):
        values = _values(p)
        assert len(p.answer) == len(clean.answer) and p.prompt == clean.prompt
        slips += sum(values[i] != (values[i - 1] + values[i - 2]) % 100 for i in range(2, 17))
        for i, step in enumerate(p.answer.split(";")):  # later steps copy the slip: the chain stays consistent
            assert step.startswith(f"{values[i]:02d}+{values[i + 1]:02d}=")
    assert 0.03 < slips / (200 * 15) < 0.07
    with pytest.raises(ValueError, match="rate=1.5 is invalid"):
        chain.corrupt(items, 1.5)


def test_chain_task_is_a_task_with_a_long_budget():
    t = ChainTask()
    check_task(t)
    assert isinstance(t, Task) and t.max_new_tokens >= 135
    tokens, mask = t.batch(t.problems(3))
    assert tokens.shape == (3, 141) and mask.sum(1).tolist() == [135] * 3
    with pytest.raises(ValueError, match="n=301 is invalid"):
        t.evaluation(301)
