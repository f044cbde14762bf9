"""Keep what SGLang's processes print to stderr, so that a failed engine start can say why."""

from __future__ import annotations

import os


class StderrTee:
    """Keep the last lines written to fd 2 by this process and by the SGLang processes it spawns (they
    inherit fd 2), while still passing everything through to the original stderr (Ray's worker log)."""

    def __init__(self, keep: int = 300):
        import collections
        import threading

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
        """SGLang's own failure: the last exception line (`SomeError: message`) and the lines before it."""
        lines = list(self.lines)
        for i in range(len(lines) - 1, -1, -1):
            head = lines[i].split(":", 1)[0]
            if head and " " not in head and (head.endswith(("Error", "Exception")) or "Error" in head):
                return "\n".join(lines[max(0, i - 6): i + 1])
        return "\n".join(lines[-15:])
