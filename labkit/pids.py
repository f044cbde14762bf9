"""Whether a process that left files behind is still there: the one check behind every sweep of leftovers
(shared-memory segments, staging copies, ring sockets) whose owner may have been SIGKILLed. Pure: os only."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True unless no process has `pid` (another user's process counts as alive: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespace() -> str:
    """This process's pid namespace ("0" where /proc does not say): pids name processes only within one, so a
    file a process in another container left behind cannot be judged by its pid."""
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return "0"
