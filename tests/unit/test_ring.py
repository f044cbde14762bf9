"""The colocated sync's one-call ring: the engine side (labkit.engine.inside.ring.serve) against the trainer side
(labkit.sync.transports.ring.Ring) over a real Unix socket. The engine's call runs `serve` in this process, as
labkit's loader runs it inside SGLang's scheduler; the integration tests run it through a real engine."""

import shutil
import socket
import tempfile
import threading

import pytest

from labkit.engine.inside import ring
from labkit.engine.errors import EngineError
from labkit.sync.transports.ring import Ring


class _Serializer:
    @staticmethod
    def serialize(named, output_str=False):
        return named


class _Engine:
    """Answers the ring's call by serving it; `fail_at`: the bucket whose apply raises."""

    def __init__(self, fail_at: int | None = None):
        self.applied, self.fail_at, self.error, self.formats = [], fail_at, None, []

    def update_weights_from_tensor(self, payloads, load_format=None, flush_cache=True):
        (named,) = payloads
        self.formats.append((load_format, flush_cache))

        def apply_payload(data: bytes):
            if len(self.applied) == self.fail_at:
                raise RuntimeError(f"apply failed at {data.decode()}")
            self.applied.append(data)

        try:
            return ring.serve(named[0][0], apply_payload)
        except Exception as e:
            self.error = e
            raise EngineError(f"update_weights_from_tensor failed: {e}") from None


def test_every_payload_is_applied_in_order_in_one_call():
    engine = _Engine()
    r = Ring(engine, _Serializer, buckets=3, timeout_s=10)
    for i in range(3):
        r.send(f"b{i}".encode())
    r.finish()
    assert engine.applied == [b"b0", b"b1", b"b2"]
    assert engine.formats == [("labkit.engine.inside.apply.load_flat", False)]
    assert not r.dir.exists()


def test_an_engine_failure_reaches_the_trainer_with_the_engines_message():
    engine = _Engine(fail_at=1)
    r = Ring(engine, _Serializer, buckets=3, timeout_s=10)
    r.send(b"b0")
    with pytest.raises(EngineError, match="apply failed at b1"):
        r.send(b"b1")
    r.abort()
    assert not r.dir.exists()


def test_a_trainer_that_gives_up_ends_the_engines_call_without_an_error():
    """Raising in SGLang's custom loader would take its scheduler down: the call ends quietly instead."""
    engine = _Engine()
    r = Ring(engine, _Serializer, buckets=3, timeout_s=10)
    r.send(b"b0")
    r.abort()  # e.g. the export raised after the first bucket
    assert r.call.result(timeout=1) == 1 and engine.error is None
    assert engine.applied == [b"b0"]


def _serve_against(messages: list[bytes], buckets: int | None = None):
    """Run `serve` against a peer that sends `messages`, then closes; return what it applied or raised."""
    d = tempfile.mkdtemp(prefix="labkit_ring_")
    path = f"{d}/{ring.SOCKET}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    applied, out = [], {}

    def engine():
        try:
            out["n"] = ring.serve(ring.key(path, buckets or len(messages), 5), applied.append)
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=engine)
    t.start()
    conn, _ = listener.accept()
    for m in messages:
        ring.send_bucket(conn, m)
        assert conn.recv(1) == ring.ACK
    conn.close()
    t.join(10)
    listener.close()
    shutil.rmtree(d)
    return applied, out


def test_serve_reads_whole_payloads_and_ends_quietly_when_the_stream_ends_early():
    big = bytes(range(256)) * 40_000  # 10 MB: arrives whole, in order
    applied, out = _serve_against([b"a", big, b""])
    assert applied == [b"a", big, b""] and out == {"n": 3}
    applied, out = _serve_against([b"a"], buckets=2)
    assert applied == [b"a"] and out == {"n": 1}  # ended early: one applied, no exception


def test_an_apply_error_is_not_taken_for_the_trainer_ending_the_stream():
    def apply_payload(data):
        raise FileNotFoundError("a staging file the store removed")  # an OSError, like a closed socket

    d = tempfile.mkdtemp(prefix="labkit_ring_")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{d}/{ring.SOCKET}")
    listener.listen(1)
    out = {}

    def engine():
        try:
            ring.serve(ring.key(f"{d}/{ring.SOCKET}", 1, 5), apply_payload)
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=engine)
    t.start()
    conn, _ = listener.accept()
    ring.send_bucket(conn, b"x")
    t.join(10)
    conn.close()
    listener.close()
    shutil.rmtree(d)
    assert isinstance(out["error"], FileNotFoundError)


def test_the_engine_connects_to_labkit_ring_sockets_only():
    with pytest.raises(ValueError, match="not a labkit ring socket"):
        ring.check_path("/tmp/elsewhere/ring.sock")
    d = tempfile.mkdtemp(prefix="labkit_ring_")
    with pytest.raises(ValueError, match="not a labkit ring socket"):
        ring.check_path(d + "/other.sock")
    shutil.rmtree(d)


def test_the_ring_directories_of_dead_trainers_are_swept_and_the_living_ones_kept(tmp_path):
    """A SIGKILLed trainer leaves its ring directory behind; the next trainer's first ring removes it."""
    import os
    import subprocess
    import sys

    from labkit.pids import namespace
    from labkit.sync.transports.ring import PREFIX, sweep_dead

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is now free (nothing in this test reuses it)
    ns = namespace()
    dead, alive = tmp_path / f"{PREFIX}pid-{ns}.{child.pid}-abc", tmp_path / f"{PREFIX}pid-{ns}.{os.getpid()}-def"
    elsewhere = tmp_path / f"{PREFIX}pid-1.{child.pid}-ghi"  # another pid namespace (a container): its pids unseen
    other = tmp_path / "labkit_ring_12_xyz"  # not in the pid form: never touched
    for d in (dead, alive, elsewhere, other):
        d.mkdir()
    assert sweep_dead(str(tmp_path), force=True) == [str(dead)]
    assert not dead.exists() and alive.exists() and elsewhere.exists() and other.exists()


def test_owner_reads_namespace_and_pid_from_the_name_only_in_its_form():
    from labkit.pids import owner

    assert owner("labkit_ring_pid-4026.123-ab_c", "labkit_ring_") == ("4026", 123)
    for name in ("labkit_ring_pid-4026.123", "labkit_ring_12_x", "labkit_ring_pid-.5-x", "labkit_ring_pid-7.x-y",
                 "labkit_stage_pid-1.5-x"):
        assert owner(name, "labkit_ring_") is None, name
