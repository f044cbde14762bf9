"""Whether a process that left files behind is still there: the one check behind every sweep of leftovers
(shared-memory segments, staging copies, ring sockets) whose owner may have been SIGKILLed. Pure: os only."""

from __future__ import annotations

import os
from pathlib import Path


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


def owner_tag() -> str:
    """`pid-<namespace>.<pid>`: what a directory this process makes carries in its name, so that `dead` can
    judge it later. Put it between a fixed prefix and a "-" (mkdtemp's random part has no "-")."""
    return f"pid-{namespace()}.{os.getpid()}"


def owner(name: str, prefix: str) -> tuple[str, int] | None:
    """(pid namespace, pid) of an entry named `<prefix>pid-<namespace>.<pid>-…` (`owner_tag`), else None."""
    head = f"{prefix}pid-"
    if not name.startswith(head) or "-" not in name[len(head):]:
        return None
    ns, _, pid = name[len(head):].split("-", 1)[0].partition(".")
    return (ns, int(pid)) if ns and pid.isdigit() else None


def dead(root: str | os.PathLike, prefix: str) -> list[Path]:
    """Entries of `root` named `<prefix>pid-<namespace>.<pid>-…` (see `owner_tag`) whose process is gone, made
    in this process's pid namespace by this user. Any other entry is left out: one made in another namespace
    (a container sharing /dev/shm or /tmp, whose pids this one cannot see: `alive` would call a live owner
    dead and a sweep would delete its files), another user's, or one not named in this form. Nothing is
    judged where the namespace is unknown."""
    ns = namespace()
    if ns == "0":
        return []
    out = []
    for d in Path(root).glob(f"{prefix}pid-{ns}.*-*"):
        who = owner(d.name, prefix)
        try:
            if who is not None and who[0] == ns and d.stat().st_uid == os.getuid() and not alive(who[1]):
                out.append(d)
        except OSError:  # gone meanwhile
            continue
    return sorted(out)
