"""The task object: the arithmetic default and the README's custom task (exec'd from the README itself, so the
example is the one tested) give problems, rewards and supervised batches through their tokenizer, and a
malformed task is refused before anything starts."""

import re
from pathlib import Path

import pytest

from labkit.models.tokenizer import EOS, PAD, decode
from labkit.tasks import ArithTask, CharTokenizer, Task, Tokenizer, arith, check_task

README = Path(__file__).resolve().parents[2] / "docs" / "python.md"  # the README's Python page


def readme_task():
    """The `class ReverseTask` block of README's "From Python" section, executed."""
    text = README.read_text().split("## A task of your own", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class ReverseTask" in b)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    return ns["ReverseTask"]


def test_the_readme_custom_task_is_a_task_with_prompts_reward_and_batch():
    task = readme_task()()
    assert isinstance(task, Task) and isinstance(task.tokenizer, Tokenizer)
    check_task(task)
    ps = task.problems(6, seed=4)
    assert ps == task.problems(6, seed=4) and ps != task.problems(6, seed=5)
    assert all(re.fullmatch(r"[a-f]{4}\|", p.prompt) and p.target == p.prompt[:4][::-1] for p in ps)
    assert task.reward(ps[0], ps[0].target) == 1.0 and task.reward(ps[0], ps[0].target + "\n") == 1.0
    assert task.reward(ps[0], ps[0].prompt[:4]) == 0.0 or ps[0].prompt[:4] == ps[0].target
    tokens, mask = task.batch(ps)
    assert tokens.shape == mask.shape == (6, 5 + 4 + 1)  # prompt "abcd|", target, EOS: all the same length
    for row, m, p in zip(tokens.tolist(), mask.tolist(), ps):
        assert decode(row[:5]) == p.prompt and m == [0] * 5 + [1] * 5
        assert decode([t for t, k in zip(row, m) if k]) == p.target and row[-1] == EOS


def test_arith_task_is_the_module_functions_through_its_tokenizer():
    task = ArithTask()
    assert isinstance(task, Task) and task.tokenizer == CharTokenizer()
    ps = task.problems(32, seed=3)
    assert ps == arith.problems(32, seed=3)  # the default task changes no seed's problems
    assert task.reward(ps[0], ps[0].answer) == 1.0 and task.reward(ps[0], ps[0].answer + "1") == 0.0
    (t1, m1), (t2, m2) = task.batch(ps), arith.batch(ps)
    assert t1.equal(t2) and m1.equal(m2)
    assert (t1[m1 == 0] != EOS).all() and int(m1.sum()) == sum(len(p.answer) + 1 for p in ps)
    short = min(range(len(ps)), key=lambda i: len(ps[i].prompt) + len(ps[i].answer))
    assert t1[short, -1] == PAD or len(ps[short].prompt) + len(ps[short].answer) + 1 == t1.shape[1]
    assert ArithTask(max_operand=3).problems(50, seed=1) == arith.problems(50, seed=1, max_operand=3)
    assert not hasattr(arith, "corpus")
    with pytest.raises(ValueError, match="max_new_tokens=0 is invalid"):
        ArithTask(max_new_tokens=0)


def test_a_malformed_task_is_refused_naming_what_it_lacks():
    class NoBatch:
        tokenizer, max_new_tokens = CharTokenizer(), 4

        def problems(self, n, seed=0):
            return []

        def reward(self, p, c):
            return 0.0

    with pytest.raises(TypeError, match=r"task=.*NoBatch.* lacks batch"):
        check_task(NoBatch())

    class BadTokenizer(NoBatch):
        tokenizer = "char"

        def batch(self, ps):
            return None

    with pytest.raises(TypeError, match=r"task.tokenizer='char' is invalid"):
        check_task(BadTokenizer())


def test_workbench_refuses_a_bad_task_before_anything_starts(monkeypatch):
    """Ray may already run in this process (other tests share it), so the check is that Workbench never
    reaches the runtime: a bad task must fail before `runtime.init`, the trainer or the engine are touched."""
    from labkit.workbench import core

    def started(*a, **k):
        raise AssertionError("Workbench reached runtime.init with a malformed task")

    monkeypatch.setattr(core.runtime, "init", started)
    with pytest.raises(TypeError, match="lacks problems, reward, batch, tokenizer, max_new_tokens"):
        core.Workbench(task=object())


def test_a_workbench_whose_engine_fails_to_start_stops_what_it_started(monkeypatch):
    """A half-built Workbench has no owner to close it: the trainer and placement group it started must be
    stopped before the engine's error reaches the caller (they held CPUs, memory and /dev/shm otherwise)."""
    from labkit.workbench import core

    stopped = []

    class Started:
        def __init__(self, name):
            self.name = name

        def shutdown(self):
            stopped.append(self.name)

        def remove(self):
            stopped.append(self.name)

        def strategy(self, _):
            return None

    def no_engine(*a, **k):
        raise RuntimeError("engine did not start: port taken")

    from labkit.engine import startup

    monkeypatch.setattr(core.runtime, "init", lambda: {"gpus": 0})
    monkeypatch.setattr(core, "place", lambda *a, **k: Started("placement"))
    monkeypatch.setattr(core, "Trainer", lambda *a, **k: Started("trainer"))
    monkeypatch.setattr(startup.EngineHandle, "start", no_engine)
    with pytest.raises(RuntimeError, match="port taken"):
        core.Workbench(progress=False)
    assert stopped == ["trainer", "placement"]
