"""labkit.engine.startup.start_beside: a trainer and its engines start side by side, and whichever fails, the caller
is left holding every engine that started (to stop it) and sees the trainer's error first."""

import threading
import time

import pytest

from labkit.engine import startup


@pytest.fixture
def engines_start(monkeypatch):
    """start_engines replaced by one that records its thread and appends an engine (or fails after a while)."""
    seen = {}

    seen["running"] = threading.Event()

    def fake(cfg, placement, n, started):
        seen["thread"] = threading.current_thread().name
        seen["running"].set()
        time.sleep(0.2)
        started.append(f"engine-{len(started)}")
        if cfg == "fail":
            raise RuntimeError("engine did not start")
        return started

    monkeypatch.setattr(startup, "start_engines", fake)
    return seen


def test_side_by_side_returns_the_trainer_and_keeps_the_engine(engines_start):
    started = []
    # the trainer's start sees the engines' start under way: they overlap
    out = startup.start_beside(lambda: engines_start["running"].wait(30), "cfg", None, 1, started, overlap=True)
    assert (out, started) == (True, ["engine-0"])
    assert engines_start["thread"].startswith("labkit-start")


def test_one_after_the_other_in_this_thread(engines_start):
    started = []
    assert startup.start_beside(lambda: "trainer", "cfg", None, 1, started, overlap=False) == "trainer"
    assert engines_start["thread"] == threading.current_thread().name and started == ["engine-0"]


def test_a_failed_trainer_waits_for_the_engine_and_raises_its_own_error(engines_start):
    started = []

    def trainer():
        raise ValueError("bad layout")

    with pytest.raises(ValueError, match="bad layout"):
        startup.start_beside(trainer, "cfg", None, 1, started, overlap=True)
    assert started == ["engine-0"]  # the engine's start had ended: the caller can stop it


def test_a_failed_engine_is_raised_after_the_trainer_started(engines_start):
    started, trainers = [], []
    with pytest.raises(RuntimeError, match="engine did not start"):
        startup.start_beside(lambda: trainers.append("t"), "fail", None, 1, started, overlap=True)
    assert trainers == ["t"] and started == ["engine-0"]
