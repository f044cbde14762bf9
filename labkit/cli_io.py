"""What every `labkit` subcommand shares: the JSON it prints and the stored run it writes (with its command)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path


def emit(metrics: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(metrics, default=str), flush=True)
    else:
        for k, v in metrics.items():
            print(f"{k:<32} {v}")


COMMAND: list[str] = []  # this invocation's argv: a stored run says what made it


def write_run(metrics: dict, path: str | None) -> None:
    """`--out PATH`: the run as JSON, led by the command that made it (stored runs under data/ are quoted)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        record = {"command": shlex.join(["labkit", *COMMAND]), **metrics}
        Path(path).write_text(json.dumps(record, indent=2, default=str))
