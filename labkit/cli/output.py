"""What every `labkit` subcommand shares: the JSON it prints, the stored run it writes (with its command), and
the configs of the flags for both (`Output`) and for the model it runs on (`ModelFlags`)."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.config import add_arguments, check


def _path(name: str, value: object) -> None:
    check(value is None or (isinstance(value, str) and value.strip() != ""), name, value, "None or a non-empty path")


@dataclass(kw_only=True, slots=True, frozen=True)
class Output:
    """Where a subcommand's result goes: stdout (plain lines or one JSON object) and, if asked, a stored run."""

    json: bool = False
    """Print the result as one JSON object on the last stdout line."""
    out: str | None = None
    """Also write the result to this JSON file, led by the command that made it (the stored runs under data/)."""

    def __post_init__(self) -> None:
        check(isinstance(self.json, bool), "json", self.json, "True or False")
        _path("out", self.out)


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelFlags:
    """The model a subcommand runs on: a family name or a checkpoint directory."""

    model: str | None = None
    """A model family or an HF model directory."""
    model_dir: str | None = None
    """An HF model directory (the same as --model DIR)."""

    def __post_init__(self) -> None:
        _path("model", self.model)
        _path("model_dir", self.model_dir)


def add_model_arguments(parser, default: str) -> None:
    """--model and --model-dir (ModelFlags), the families listed and `default` named in the help."""
    from labkit.models.families import FAMILY_SIZES

    add_arguments(parser, ModelFlags, ("model", "model_dir"),
                  notes={"model": f"Families: {', '.join(('mimo', *FAMILY_SIZES))}. None: {default}."})


def model_of(args) -> str | None:
    """The model the command line names: --model-dir, else --model, else None."""
    return args.model_dir or args.model


def emit(metrics: dict, as_json: bool, *, width: int = 32, skip: tuple[str, ...] = ()) -> None:
    """The result on stdout: one JSON object on one line (after whatever was printed before), or `key value`
    lines (the keys in `skip` left out)."""
    if as_json:
        sys.stdout.flush()
        print(json.dumps(metrics, default=str), flush=True)
    else:
        for k, v in metrics.items():
            if k not in skip:
                print(f"{k:<{width}} {v}")


COMMAND: list[str] = []  # this invocation's argv: a stored run says what made it
ARGS: dict = {}  # every flag's value as parsed, defaults included: the run's full configuration
STARTED: dict = {}  # the provenance taken as the command started (`start`): the code that ran, not the code at exit


def command() -> str:
    """This invocation as one shell line, `labkit ...`."""
    return shlex.join(["labkit", *COMMAND])


def start() -> None:
    """Take the run's provenance now, before it runs: a file edited during a long run must not pass for what ran."""
    from labkit import provenance

    STARTED.clear()
    STARTED.update(provenance.collect(config=dict(ARGS), seeds={k: v for k, v in ARGS.items() if "seed" in k}))


def write_run(metrics: dict, path: str | None, *, indent: int = 2) -> None:
    """`--out PATH`: the run as JSON, led by the command that made it and its provenance (labkit.provenance:
    commit and dirty flag, date, host, versions, every flag's value and the seeds among them), so a stored run
    under data/ says what code on what machine made it."""
    if path:
        if not STARTED:
            start()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        prov = dict(STARTED)
        if not prov["host"]["gpus"]:  # taken before the run imported torch: a GPU is named once torch sees it
            from labkit.provenance import host

            prov["host"] = host()
        record = {"command": command(), "provenance": prov, **metrics}
        Path(path).write_text(json.dumps(record, indent=indent, default=str) + "\n")
