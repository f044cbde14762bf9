"""The engine side of a colocated sync in one call: every bucket of the sync applied inside one
`update_weights_from_tensor`, told bucket by bucket over a local socket.

Why: as its own SGLang call, each bucket would pay a round trip (trainer -> Ray -> the engine actor's tokenizer
manager -> ZMQ -> scheduler and back) on the critical path, and SGLang serializes weight updates (the tokenizer
manager's writer lock), so two calls cannot be in flight to hide it. Here the first call stays open for the whole sync
(what checkpoint-engine's pipelined update does over ZMQ): the trainer sends each bucket's payload over a Unix socket
once the bucket is packed, the scheduler applies it by the same copy plan (labkit.engine.inside.apply) and answers one
byte, and the trainer reuses that bucket's buffer: one round trip per sync instead of one per bucket.

Each message is what one bucket's own call would have carried (`[(payload name, tensor)]` through SGLang's
serializer: a handle to the shared buffer, which the engine resolves to the mapping it keeps, or a staging-file
name, or a delta payload), so every kind of bucket takes the ring. The socket lives in a directory only the
trainer's user can enter (`labkit_ring_*/ring.sock`), the engine connects to no other path, and it unpickles a
message with SGLang's own restricted unpickler, as it does the call's payload. Every wait is bounded by the
sync's call timeout. A trainer that fails, dies or goes silent past the timeout ends the call early and quietly:
SGLang 0.5.23 runs a custom loader without an exception handler, so raising there would take the scheduler (and
the engine) down for a failure on the trainer's side; the trainer knows it failed, and its atomic guard restores
the last good weights into the engine that is still up.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "labkit-ring/1:"  # PREFIX + json {"path", "buckets", "timeout_s"}
SOCKET = "ring.sock"
_HEAD = struct.Struct("<Q")  # the length of one bucket's serialized payload
ACK = b"\x01"


def key(path: str, buckets: int, timeout_s: float) -> str:
    return PREFIX + json.dumps({"path": path, "buckets": buckets, "timeout_s": timeout_s})


def check_path(path: str) -> str:
    """The socket's real path, refused unless it is a labkit ring socket (`labkit_ring_*/ring.sock`)."""
    real = Path(os.path.realpath(path))
    if real.name != SOCKET or not real.parent.name.startswith("labkit_ring_"):
        raise ValueError(f"labkit ring: {path!r} is not a labkit ring socket (labkit_ring_*/{SOCKET}): an engine "
                         "connects to no other path a payload names")
    return str(real)


def send_bucket(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_HEAD.pack(len(payload)) + payload)


def recv_bucket(sock: socket.socket) -> bytes:
    (n,) = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
    return _recv_exact(sock, n)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(min(n - len(out), 1 << 20))
        if not got:
            raise ConnectionError("labkit ring: the trainer closed the stream before the sync's last bucket")
        out += got
    return bytes(out)


def serve(name: str, apply_payload) -> int:
    """Apply the sync's buckets as the trainer sends them: `apply_payload(bytes)` per bucket, one acknowledgement
    byte after each. Returns how many were applied: all of them, or fewer when the trainer ended the stream
    (logged, never raised: see the module docstring). An exception of `apply_payload` propagates, as it would
    from a call per bucket."""
    spec = json.loads(name[len(PREFIX):])
    path, n = check_path(spec["path"]), int(spec["buckets"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(float(spec["timeout_s"]))
        try:
            sock.connect(path)
        except OSError as e:
            return _ended(0, n, e)
        for i in range(n):
            try:
                data = recv_bucket(sock)  # the end of the stream is a ConnectionError, a timeout an OSError
            except OSError as e:
                return _ended(i, n, e)
            apply_payload(data)
            try:
                sock.sendall(ACK)
            except OSError as e:
                return _ended(i + 1, n, e)
    return n


def _ended(done: int, n: int, e: OSError) -> int:
    logger.warning("labkit ring: the trainer ended the sync after %d of %d buckets (%s: %s); the engine keeps "
                   "running, and the trainer's guard restores its last good weights", done, n, type(e).__name__, e)
    return done
