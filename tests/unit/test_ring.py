"""The colocated sync's one-call ring: the engine side (labkit.engine.ring.serve) against the trainer side
(labkit.sync.transports.ring.Ring) over a real Unix socket. The engine's call runs `serve` in this process, as
labkit's loader runs it inside SGLang's scheduler; the integration tests run it through a real engine."""

import socket
import tempfile
import threading

import pytest
import torch

from labkit.engine import ring
from labkit.engine.errors import EngineError
from labkit.sync.transports.ring import Ring


class _Serializer:
    @staticmethod
    def serialize(named, output_str=True):
        return named


class _Engine:
    """Answers the ring's call by serving it; `fail_at`: the bucket whose apply raises."""

    def __init__(self, fail_at: int | None = None):
        self.applied, self.fail_at, self.error = [], fail_at, None

    def update_weights_from_tensor(self, payloads, load_format=None, flush_cache=True):
        (named,) = payloads
        slots = [t for n, t in named[1:] if n == ring.SLOT]

        def apply_one(name, flat):
            if len(self.applied) == self.fail_at:
                raise RuntimeError(f"apply failed at {name}")
            self.applied.append((name, flat))

        try:
            return ring.serve(named[0][0], slots, apply_one)
        except Exception as e:
            self.error = e
            raise EngineError(f"update_weights_from_tensor failed: {e}") from None


def test_every_bucket_is_applied_from_its_slot_in_order():
    slots = [torch.zeros(8, dtype=torch.uint8), torch.ones(8, dtype=torch.uint8)]
    engine = _Engine()
    r = Ring(engine, _Serializer, slots, buckets=3, timeout_s=10)
    r.send("b0", slots[0])
    r.send("b1", slots[1])
    r.send("b2", None)  # in the staging file
    r.finish()
    assert [n for n, _ in engine.applied] == ["b0", "b1", "b2"]
    assert engine.applied[0][1] is slots[0] and engine.applied[1][1] is slots[1]
    assert engine.applied[2][1].numel() == 1  # the placeholder: the name says where the bucket lies
    assert not r.dir.exists()


def test_an_engine_failure_reaches_the_trainer_with_the_engines_message():
    slots = [torch.zeros(8, dtype=torch.uint8)]
    engine = _Engine(fail_at=1)
    r = Ring(engine, _Serializer, slots, buckets=3, timeout_s=10)
    r.send("b0", slots[0])
    with pytest.raises(EngineError, match="apply failed at b1"):
        r.send("b1", slots[0])
    r.abort()
    assert not r.dir.exists()


def test_a_trainer_that_gives_up_ends_the_engines_call():
    slots = [torch.zeros(8, dtype=torch.uint8)]
    engine = _Engine()
    r = Ring(engine, _Serializer, slots, buckets=3, timeout_s=10)
    r.send("b0", slots[0])
    r.abort()  # e.g. the export raised after the first bucket
    assert isinstance(engine.error, ConnectionError)
    assert [n for n, _ in engine.applied] == ["b0"]


def test_a_buffer_the_engine_was_not_given_is_refused_before_it_is_named():
    slots = [torch.zeros(8, dtype=torch.uint8)]
    r = Ring(_Engine(), _Serializer, slots, buckets=1, timeout_s=10)
    with pytest.raises(ValueError, match="outside the buffers"):
        r.send("b0", torch.zeros(8, dtype=torch.uint8))
    r.abort()


def _serve_against(messages: list[tuple[int, str]], n_slots: int = 1, buckets: int | None = None):
    """Run `serve` against a peer that sends `messages`, then closes; return what it applied or raised."""
    d = tempfile.mkdtemp(prefix="labkit_ring_")
    path = f"{d}/{ring.SOCKET}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    applied, out = [], {}

    def engine():
        try:
            out["n"] = ring.serve(ring.key(path, buckets or len(messages), 5), [torch.zeros(1)] * n_slots,
                                  lambda name, flat: applied.append(name))
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=engine)
    t.start()
    conn, _ = listener.accept()
    for slot, name in messages:
        ring.send_bucket(conn, slot, name)
        if conn.recv(1) != ring.ACK:
            break
    conn.close()
    t.join(10)
    listener.close()
    return applied, out


def test_serve_refuses_a_slot_it_was_not_given_and_a_stream_that_ends_early():
    applied, out = _serve_against([(0, "a"), (3, "b")], n_slots=1)
    assert applied == ["a"] and "slot 3" in str(out["error"])
    applied, out = _serve_against([(0, "a")], buckets=2)
    assert applied == ["a"] and isinstance(out["error"], ConnectionError)
    applied, out = _serve_against([(0, "a" * 100_000), (-1, "b")])  # a long payload name arrives whole
    assert applied == ["a" * 100_000, "b"] and out == {"n": 2}


def test_the_engine_connects_to_labkit_ring_sockets_only():
    with pytest.raises(ValueError, match="not a labkit ring socket"):
        ring.check_path("/tmp/elsewhere/ring.sock")
    with pytest.raises(ValueError, match="not a labkit ring socket"):
        ring.check_path(tempfile.mkdtemp(prefix="labkit_ring_") + "/other.sock")
