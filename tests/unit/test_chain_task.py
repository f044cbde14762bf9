"""The long-answer task (labkit.tasks.chain): 128-character answers, a held-out set no training chain touches
(not even inside a chain), a reward that scores the correct prefix, and a noisy corpus that stays a chain."""

import pytest

from labkit.tasks import ChainTask, Task, check_task, chain


def test_answers_are_43_terms_of_128_characters_that_follow_the_rule():
    for p in chain.problems(50, seed=3) + chain.evaluation(50):
        a, b = (int(x) for x in p.prompt.rstrip(":").split(","))
        values = [a, b] + [int(t) for t in p.answer.split(",")]
        assert len(p.answer) == 128 and len(values) == 45
        assert all(values[i] == (values[i - 1] + values[i - 2]) % 100 for i in range(2, 45))


def test_no_training_chain_contains_a_held_out_pair_anywhere():
    held = set(chain.held_out_pairs())
    assert len(held) == chain.HELD_OUT == ChainTask().evaluation_size()
    for seed in range(20):
        for p in chain.problems(64, seed=seed):
            a, b = (int(x) for x in p.prompt.rstrip(":").split(","))
            values = [a, b] + [int(t) for t in p.answer.split(",")]
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
    terms = p.answer.split(",")
    assert chain.reward(p, p.answer) == 1.0
    assert chain.reward(p, p.answer + "\nmore") == 1.0
    wrong = ",".join(terms[:10] + ["xx"] + terms[11:])
    assert chain.reward(p, wrong) == pytest.approx(10 / 43)
    assert chain.reward(p, "") == 0.0


def test_a_corrupted_chain_continues_from_its_slips():
    items = chain.problems(200, seed=1)
    noisy = chain.corrupt(items, 0.05, seed=2)
    slips = 0
    for clean, p in zip(items, noisy):
        a, b = (int(x) for x in p.prompt.rstrip(":").split(","))
        values = [a, b] + [int(t) for t in p.answer.split(",")]
        assert len(p.answer) == len(clean.answer)
        slips += sum(values[i] != (values[i - 1] + values[i - 2]) % 100 for i in range(2, 45))
    assert 0.03 < slips / (200 * 43) < 0.07
    with pytest.raises(ValueError, match="rate=1.5 is invalid"):
        chain.corrupt(items, 1.5)


def test_chain_task_is_a_task_with_a_long_budget():
    t = ChainTask()
    check_task(t)
    assert isinstance(t, Task) and t.max_new_tokens >= 129
    tokens, mask = t.batch(t.problems(3))
    assert tokens.shape == (3, 135) and mask.sum(1).tolist() == [129] * 3
    with pytest.raises(ValueError, match="n=301 is invalid"):
        t.evaluation(301)
