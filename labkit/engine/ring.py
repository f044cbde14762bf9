"""The engine side of a colocated sync in one call: every bucket of the sync applied inside one
`update_weights_from_tensor`, told bucket by bucket over a local socket.

Why: each bucket used to be its own SGLang call (trainer -> Ray -> the engine actor's tokenizer manager -> ZMQ ->
scheduler and back), ~2.5 ms a round trip on the 2-core bench box, paid once per bucket on the critical path:
weight-moving time fell from 0.139 s to 0.110 s on the bench model when the same bytes went in 5 buckets
instead of 11 (32 -> 64 MiB). SGLang serializes weight updates (the tokenizer manager's writer lock), so two
calls cannot be in flight to hide it. Here the first call stays open for the whole sync (what checkpoint-engine's
pipelined update does over ZMQ): the trainer names each bucket over a Unix socket once it is packed, the
scheduler applies it by the same copy plan (labkit.engine.apply) and answers one byte, and the trainer reuses
that bucket's buffer.

The payload: `[(key(path, buckets, timeout_s), placeholder), (SLOT, buffer 0), (SLOT, buffer 1)]`: the
trainer's two shared buffers travel once, as handles; each message is (slot, the bucket's payload name), slot -1
for a bucket packed into the guard's staging file (the name says where, labkit.engine.stagefile). The socket
lives in a directory only the trainer's user can enter (`labkit_ring_*/ring.sock`), and the engine connects
to no other path. Every wait is bounded by the sync's call timeout; a trainer that dies or gives up closes the
socket, the engine sees the end of the stream before the last bucket and fails the call, and the atomic guard
restores what the engine served.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

import torch

PREFIX = "labkit-ring/1:"  # PREFIX + json {"path", "buckets", "timeout_s"}
SLOT = "labkit-ring/slot"  # the name each of the trainer's buffers travels under, in slot order
SOCKET = "ring.sock"
_HEAD = struct.Struct("<iI")  # slot (-1: in the staging file), length of the bucket's payload name
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


def send_bucket(sock: socket.socket, slot: int, name: str) -> None:
    data = name.encode()
    sock.sendall(_HEAD.pack(slot, len(data)) + data)


def recv_bucket(sock: socket.socket) -> tuple[int, str]:
    slot, n = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
    return slot, _recv_exact(sock, n).decode()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("labkit ring: the trainer closed the stream before the sync's last bucket")
        out += got
    return bytes(out)


def serve(name: str, slots: list[torch.Tensor], apply_one) -> int:
    """Apply the sync's buckets as the trainer names them: `apply_one(payload name, buffer)` per bucket, one
    acknowledgement byte after each. Returns the number of buckets; raises (failing SGLang's call) on a
    malformed message, a slot it was not given, a wait past the timeout, or a stream that ends early."""
    spec = json.loads(name[len(PREFIX):])
    placeholder = torch.zeros(1, dtype=torch.uint8)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(float(spec["timeout_s"]))
        sock.connect(check_path(spec["path"]))
        for i in range(int(spec["buckets"])):
            slot, bucket = recv_bucket(sock)
            if not -1 <= slot < len(slots):
                raise ValueError(f"labkit ring: bucket {i} names slot {slot}; the trainer sent {len(slots)} buffers")
            apply_one(bucket, slots[slot] if slot >= 0 else placeholder)
            sock.sendall(ACK)
    return int(spec["buckets"])
