"""Failpoints: named places inside a sync where `labkit faults` and the tests inject a fault. Off by default.

A foundation module (it imports nothing of labkit but `config`): the sync layer and the engine's model code
(SGLang's scheduler process) both fire points, and neither may import the other.

A failpoint is armed in the process where it fires (a trainer rank; the driver reaches it with Ray's
`actor.__ray_call__`), so no trainer or engine code needs a test-only branch. Unarmed, `hit()` is one dict
lookup. The points (in the order a sync reaches them):

    sync.begin       after begin_weight_update, before the first bucket
    sync.bucket      before bucket i is sent (nth=i+1 picks the bucket)
    sync.end         every bucket landed, before end_weight_update
    sync.version     after end_weight_update, before the new weight_version is set
    bucket.pack      half-way through packing a bucket (nth: the bucket)
    transport.open   distributed transport, before the rendezvous port is bound (ctx: port)
    transport.peer   distributed transport, before the engine is told to join the group (`skip`: it never does)
    transport.send   flattened transports, the bucket packed, before it leaves (ctx: flat, the packed bytes)
    engine.apply     inside the engine's apply (SGLang's scheduler process, labkit's model `load_weights`),
                     before the nth tensor whose name contains `match` (e.g. ".k_proj.": q of that fused
                     group is written, k and v are not)
    engine.derive    inside the engine, after a bucket was copied in, before the model re-derives what it
                     computes from its weights at load (`labkit_after_apply`: DeepSeek's w_kc/w_vc from kv_b_proj);
                     `skip` leaves those copies stale while the bytes verify (what the behaviour probe catches)

Actions: `raise` (an exception, as a bug would), `hang` (stop, alive, until released or `limit_s`: a stuck
peer), `wait` (write `marker`, then block until the driver deletes `gate`: the driver kills a process at an
exact point, as `ray.kill` would in production), `squat` (bind and listen on ctx's port: another program
took the port we were about to use), `corrupt` (flip one byte of ctx's `flat`: damage in transit), `skip`
(`hit` answers True and the caller leaves its step out), `crash` (the process exits at once, as a segfault
would). Whatever the action, a point armed with a `marker` writes it as it fires: `labkit faults` counts a trial
only when its marker shows the fault happened.

The engine points fire in a process labkit does not start itself (SGLang's scheduler, a child of the engine
actor or server). Armed there by `arm_in_actor(engine_actor, "engine.apply", ...)`, a point is written to a file
named after the arming process, which the scheduler (its child) reads once per update call: unarmed, one
`stat` per call.
"""

from __future__ import annotations

import json
import os
import random
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

POINTS = ("sync.begin", "sync.bucket", "sync.end", "sync.version", "bucket.pack", "transport.open", "transport.peer",
          "transport.send", "engine.apply", "engine.derive")
ACTIONS = ("raise", "hang", "wait", "squat", "corrupt", "skip", "crash")
ENGINE_POINTS = ("engine.apply", "engine.derive")
ARM_DIR = Path(tempfile.gettempdir()) / "labkit-failpoints"


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
    match: str = ""  # engine.apply: count only tensors whose name contains this
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
    a = Armed(point, action, nth, **kw)
    if point in ENGINE_POINTS:  # for this process's children (SGLang's scheduler)
        ARM_DIR.mkdir(exist_ok=True)
        _sweep()
        _arm_file(os.getpid()).write_text(json.dumps({k: v for k, v in asdict(a).items() if k != "held"}))
        return
    _ARMED[point] = a


def disarm() -> dict:
    """Disarm everything in this process; returns {point: fired} for the caller's report."""
    out = {p: a.fired for p, a in _ARMED.items()}
    for a in _ARMED.values():
        for s in a.held:
            s.close()
    _ARMED.clear()
    _arm_file(os.getpid()).unlink(missing_ok=True)
    return out


def _arm_file(pid: int) -> Path:
    """The arming file of process `pid`, named by its pid and its start time: pids wrap (32,768 on a small box)
    and a file left by a dead process (an engine actor killed while armed) would otherwise arm whichever actor
    is given its pid next; that engine's scheduler then crashed while loading its model (exit 70, `crash`)."""
    return ARM_DIR / f"{pid}-{_started(pid)}.json"


_STARTED: dict[int, int] = {}


def _started(pid: int) -> int:
    """Process `pid`'s start time in clock ticks since boot (/proc/<pid>/stat, field 22); 0 where unknown."""
    if pid not in _STARTED:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            _STARTED[pid] = int(stat.rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return 0
    return _STARTED[pid]


def _sweep() -> None:
    """Remove arming files of processes that are gone (or whose pid a newer process holds)."""
    for f in ARM_DIR.glob("*.json"):
        pid, _, started = f.stem.partition("-")
        if not (pid.isdigit() and started.isdigit()) or _started_now(int(pid)) != int(started):
            f.unlink(missing_ok=True)


def _started_now(pid: int) -> int:
    _STARTED.pop(pid, None)
    return _started(pid)


_STAMPS: dict[str, int] = {}  # engine points: mtime of the arming file the in-process state was read from


def engine_armed(point: str) -> bool:
    """In an engine's scheduler: whether its parent armed `point` (read when the arming file changes; the hit
    count then lives in this process across update calls)."""
    try:
        stamp = _arm_file(os.getppid()).stat().st_mtime_ns
    except FileNotFoundError:
        _ARMED.pop(point, None)
        return False
    if _STAMPS.get(point) != stamp:
        _ARMED[point] = Armed(**json.loads(_arm_file(os.getppid()).read_text()))
        _STAMPS[point] = stamp
    return _ARMED[point].point == point and not _ARMED[point].fired


def hit(point: str, **ctx) -> bool:
    """Fire `point` if armed (and this is its nth hit). True only for a `skip` that fired."""
    a = _ARMED.get(point)
    if a is None or a.fired or (a.match and a.match not in ctx.get("name", "")):
        return False
    a.hits += 1
    if a.hits != a.nth:
        return False
    a.fired = True
    if a.marker:  # proof that it fired, readable from the driver whatever the action does to this process next
        with open(a.marker, "w") as f:
            f.write(f"{point} {os.getpid()}\n")
    if a.action == "raise":
        raise FaultInjected(f"injected fault at {point} (hit {a.hits})")
    if a.action == "skip":
        return True
    if a.action == "crash":
        os._exit(70)
    if a.action == "corrupt":
        flat = ctx["flat"]
        i = random.Random(a.hits).randrange(flat.numel())
        flat[i] ^= 0x5A  # one byte; the engine gets it as it is
        return False
    if a.action == "squat":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((ctx.get("host", "127.0.0.1"), ctx["port"]))
        s.listen(1)
        a.held.append(s)
        return False
    deadline = time.monotonic() + a.limit_s
    while time.monotonic() < deadline:  # hang / wait: alive, doing nothing, until released
        if a.gate is not None and not os.path.exists(a.gate):
            return False
        time.sleep(0.05)
    if point in ENGINE_POINTS:  # a hung engine that is never released dies, as a watchdog would kill it
        os._exit(71)
    return False


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
