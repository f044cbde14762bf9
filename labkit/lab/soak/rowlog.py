"""The soak's per-sync rows, kept on disk while the run goes (one JSON line each), read back for the verdict.

Why not a list: the driver is one of the processes the soak judges, and its own record would be judged with it.
A row carries a resource sample of every process of the run (some 30 entries: role, resident bytes, descriptors,
threads), about 10 KB of Python objects; held in a list for 300 syncs that is ~1 MB per 100 syncs of growth in the
driver, the whole of the target (`labkit soak`, data/soak_cpu.json at 3e7a957: the driver +3.4 MB per 100 syncs).
On disk the run's memory holds only the current row, and a run that stops early still has every row written.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


class RowLog:
    """Append rows (JSON-able dicts) to a file; `rows()` reads them back in order. JSON turns the pid keys of a
    resource sample into strings; the summary names a process "role pid" either way."""

    def __init__(self, path: str | Path | None = None):
        self._own = path is None
        if path is None:
            fd, path = tempfile.mkstemp(prefix="labkit_soak_rows_", suffix=".jsonl")
            self._f = open(fd, "w", encoding="utf-8")
        else:
            self._f = open(path, "w", encoding="utf-8")
        self.path = Path(path)

    def append(self, row: dict) -> None:
        self._f.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._f.flush()

    def rows(self) -> list[dict]:
        self._f.flush()
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def close(self) -> None:
        """Close the file, and remove it when this log made it (a temporary file)."""
        if not self._f.closed:
            self._f.close()
        if self._own:
            self.path.unlink(missing_ok=True)
