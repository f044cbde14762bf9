"""Failpoints: named places inside a sync where `labkit faults` and the tests inject a fault. Off by default.

A failpoint is armed in the process where it fires (a trainer rank; the driver reaches it with Ray's
`actor.__ray_call__`), so no trainer or engine code needs a test-only branch. Unarmed, `hit()` is one dict
lookup. The points (in the order a sync reaches them):

    sync.begin       after begin_weight_update, before the first bucket
    sync.bucket      before bucket i is sent (nth=i+1 picks the bucket)
    sync.end         every bucket landed, before end_weight_update
    sync.version     after end_weight_update, before the new weight_version is set
    transport.open   distributed transport, before the rendezvous port is bound (ctx: port)
    transport.send   distributed transport, after the engine started receiving, before the broadcast

Actions: `raise` (an exception, as a bug would), `hang` (stop, alive, until released or `limit_s`: a stuck
peer), `wait` (write `marker`, then block until the driver deletes `gate`: the driver kills a process at an
exact point, as `ray.kill` would in production), `squat` (bind and listen on ctx's port: another program
took the port we were about to use).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

POINTS = ("sync.begin", "sync.bucket", "sync.end", "sync.version", "transport.open", "transport.send")
ACTIONS = ("raise", "hang", "wait", "squat")


class FaultInjected(RuntimeError):
    """Raised by a `raise` failpoint (and only by it)."""


@dataclass(slots=True)
class Armed:
    point: str
    action: str
    nth: int = 1  # fire on the nth hit (sync.bucket: bucket index + 1)
    marker: str | None = None
    gate: str | None = None
    limit_s: float = 600.0  # a hang/wait never outlives this: no test leaves a process behind forever
    hits: int = 0
    fired: bool = False
    held: list = field(default_factory=list)  # squatted sockets, kept open until disarm()

    def __post_init__(self) -> None:
        from labkit.config import check

        check(self.point in POINTS, "point", self.point, f"one of {', '.join(POINTS)}")
        check(self.action in ACTIONS, "action", self.action, f"one of {', '.join(ACTIONS)}")
        check(isinstance(self.nth, int) and self.nth >= 1, "nth", self.nth, "an integer >= 1")
        check(self.action != "wait" or (self.marker and self.gate), "marker", self.marker,
              "marker and gate paths for action='wait'")


_ARMED: dict[str, Armed] = {}


def arm(point: str, action: str, nth: int = 1, **kw) -> None:
    _ARMED[point] = Armed(point, action, nth, **kw)


def disarm() -> dict:
    """Disarm everything in this process; returns {point: fired} for the caller's report."""
    out = {p: a.fired for p, a in _ARMED.items()}
    for a in _ARMED.values():
        for s in a.held:
            s.close()
    _ARMED.clear()
    return out


def hit(point: str, **ctx) -> None:
    a = _ARMED.get(point)
    if a is None or a.fired:
        return
    a.hits += 1
    if a.hits != a.nth:
        return
    a.fired = True
    if a.action == "raise":
        raise FaultInjected(f"injected fault at {point} (hit {a.hits})")
    if a.action == "squat":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((ctx.get("host", "127.0.0.1"), ctx["port"]))
        s.listen(1)
        a.held.append(s)
        return
    if a.action == "wait" and a.marker:
        with open(a.marker, "w") as f:
            f.write(f"{point} {os.getpid()}\n")
    deadline = time.monotonic() + a.limit_s
    while time.monotonic() < deadline:  # hang / wait: alive, doing nothing, until released
        if a.gate is not None and not os.path.exists(a.gate):
            return
        time.sleep(0.05)


def arm_in_actor(actor, point: str, action: str, nth: int = 1, timeout_s: float = 60.0, **kw) -> None:
    """Arm a failpoint inside a Ray actor's process (driver side)."""
    import ray

    ray.get(actor.__ray_call__.remote(_remote_arm, point, action, nth, kw), timeout=timeout_s)


def disarm_in_actor(actor, timeout_s: float = 60.0) -> dict:
    import ray

    return ray.get(actor.__ray_call__.remote(_remote_disarm), timeout=timeout_s)


def _remote_arm(_self, point, action, nth, kw):
    arm(point, action, nth, **kw)


def _remote_disarm(_self):
    return disarm()
