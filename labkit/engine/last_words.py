"""What an engine actor's SGLang processes said before it died, kept where the driver can read it.

SGLang's subprocesses (scheduler, detokenizer) report their own failure by logging a traceback to stderr and sending
SIGQUIT to their parent. In the launch phase we turn that into an exception (`launch_sigquit`), so `ready()` can
answer why. Once serving, SGLang's tokenizer manager kills the whole process tree on SIGQUIT, so a Ray actor died
and the driver heard only Ray's "The actor died unexpectedly before finishing this task": the traceback stayed in a
worker log on the engine's node. (A CI run lost exactly that: a per-tensor sync failed because a scheduler raised
inside `process_input_requests`, and the test report did not say what it raised.)

So the actor keeps the last lines written to fd 2 (`StderrTee`), and its SIGQUIT handler, before SGLang's, puts the
root cause into Ray's key-value store (in the GCS, so a driver on another node reads it too) under the actor's
id; `heard(actor)` reads and removes it. One small key per death, removed when read or when the handle shuts
the actor down.
"""

from __future__ import annotations

import collections
import os
import threading
import time

KEY = "labkit/engine-last-words/"


class LaunchFailed(RuntimeError):
    pass


def launch_sigquit(signum, frame):
    """SGLang's children SIGQUIT their parent when they fail during launch. SGLang's default handler then
    kills this whole process, so a Ray actor would die without saying why; we raise instead, which aborts
    Engine.__init__ where it waits, and report the child's traceback. (Module-level: ServerArgs is pickled
    to the children. Once serving, SGLang's tokenizer manager installs its own handler: `record_on_sigquit`.)"""
    raise LaunchFailed("an SGLang subprocess failed during engine launch (SIGQUIT)")


class StderrTee:
    """Keep the last lines written to fd 2 by this process and by the SGLang processes it spawns (they
    inherit fd 2), while still passing everything through to the original stderr (Ray's worker log)."""

    def __init__(self, keep: int = 300):
        self.lines = collections.deque(maxlen=keep)
        self._orig = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
        threading.Thread(target=self._pump, args=(r,), daemon=True, name="labkit-stderr-tee").start()

    def _pump(self, r: int) -> None:
        pending = b""
        while chunk := os.read(r, 65536):
            os.write(self._orig, chunk)
            *done, pending = (pending + chunk).split(b"\n")
            self.lines.extend(x.decode(errors="replace") for x in done)

    def root_cause(self) -> str:
        return root_cause(list(self.lines))


def root_cause(lines: list[str]) -> str:
    """SGLang's own failure: the last exception line (`SomeError: message`) and the lines before it."""
    for i in range(len(lines) - 1, -1, -1):
        head = lines[i].split(":", 1)[0].strip()
        if head and " " not in head and (head.endswith(("Error", "Exception")) or "Error" in head):
            return "\n".join(lines[max(0, i - 6): i + 1])
    return "\n".join(lines[-15:])


def summary(cause: str) -> str:
    """One line from a root cause: its exception line, and the innermost `File "...", line N` frame before it."""
    lines = [ln.strip() for ln in cause.splitlines() if ln.strip()]
    if not lines:
        return ""
    frames = [ln for ln in lines if ln.startswith("File ")]
    where = ""
    if frames:
        parts = frames[-1].split('"')
        path = parts[1] if len(parts) > 2 else ""
        line = frames[-1].rsplit("line ", 1)[-1].split(",")[0]
        where = f" (at {'/'.join(path.split('/')[-2:])}:{line})"
    return f"{lines[-1]}{where}"


def record_on_sigquit(engine, tee: StderrTee, actor_id: str) -> None:
    """Before SGLang's running-phase SIGQUIT handler kills this process tree, store what its child said."""
    from sglang.srt.managers.tokenizer_manager import SignalHandler

    class Recording(SignalHandler):
        def running_phase_sigquit_handler(self, signum=None, frame=None):
            try:
                time.sleep(0.3)  # the child wrote its traceback before its signal; let the tee's pump take it
                _put(actor_id, tee.root_cause())
            finally:
                super().running_phase_sigquit_handler(signum, frame)

    tm = engine.tokenizer_manager
    tm.signal_handler_class = Recording  # SGLang installs it with its event loop, at the first request
    if tm.event_loop is not None and threading.current_thread() is threading.main_thread():  # already installed
        import signal

        tm.event_loop.add_signal_handler(signal.SIGQUIT, Recording(tm).running_phase_sigquit_handler)


def _put(actor_id: str, text: str) -> None:
    from ray.experimental import internal_kv

    try:
        internal_kv._internal_kv_put(KEY + actor_id, text[-8000:].encode(errors="replace"))
    except Exception:  # best effort: dying anyway, and SGLang's handler must still run
        pass


def heard(actor) -> str:
    """The last words `actor` stored as it died ('' if none), removed from the store."""
    from ray.experimental import internal_kv

    key = KEY + actor._actor_id.hex()
    try:
        text = internal_kv._internal_kv_get(key)
        if text is not None:
            internal_kv._internal_kv_del(key)
    except Exception:
        return ""
    return "" if text is None else text.decode(errors="replace")


def forget(actor) -> None:
    """Remove what `actor` may have stored (its handle is shutting it down)."""
    from ray.experimental import internal_kv

    try:
        internal_kv._internal_kv_del(KEY + actor._actor_id.hex())
    except Exception:
        pass
