"""Every labkit actor is created with Ray's task events off (labkit.cluster.runtime.ACTOR_OPTIONS): with them on,
the GCS keeps a record of every actor call, and its memory grows sync after sync until Ray's cap."""

from labkit.cluster import runtime
from labkit.engine import lifecycle


def test_the_engine_actor_is_created_without_task_events(monkeypatch):
    seen = {}

    class Remote:
        def options(self, **kw):
            seen.update(kw)
            raise RuntimeError("stop here")

    monkeypatch.setattr(lifecycle, "remote_class", lambda **kw: Remote())
    monkeypatch.setattr(lifecycle, "check_startable", lambda cfg: None)
    monkeypatch.setattr(runtime, "init", lambda *a, **k: {})
    try:
        lifecycle.start_actor(object())
    except RuntimeError:
        pass
    assert seen.get("enable_task_events") is False


def test_the_trainer_rank_options_turn_task_events_off():
    import inspect

    from labkit.trainer import group

    assert runtime.ACTOR_OPTIONS == {"enable_task_events": False}
    assert "runtime.ACTOR_OPTIONS" in inspect.getsource(group.Trainer.__init__)


def test_each_engine_actor_call_turns_task_events_off_itself():
    """A handle that crossed to another process (the trainer's, for per-tensor syncs) did not keep the actor's
    setting: the GCS recorded those calls. The backend asks for it on every call."""
    from labkit.engine.actor import ActorBackend

    seen = {}

    class Method:
        def options(self, **kw):
            seen.update(kw)
            return self

        def remote(self, *a, **k):
            raise RuntimeError("stop here")

    class Actor:
        checksums = Method()

    try:
        ActorBackend(Actor(), 1.0).checksums()
    except RuntimeError:
        pass
    assert seen == {"enable_task_events": False}
