"""The `labkit` command line. Every subcommand with --json ends with one JSON object on the last stdout line.

Flags come from the configs' fields (labkit.config.add_arguments); a subcommand imports what it runs when it
runs, so `labkit --help` and a refused flag load no torch, Ray or SGLang."""

# The modules follow the audience: main_job (doctor, demo, sync), lab (bench, tune, roofline, report, pretrain),
# experiments (mtp-experiment, faults), notebooks (notebook run/sweep/list/check), output (what they all share).

from __future__ import annotations

import argparse
import os
import sys

from labkit.cli import experiments, lab, main_job, notebooks
from labkit.cli.output import ARGS, COMMAND, STARTED, start
from labkit.compat import quiet


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="show every warning (LABKIT_VERBOSE=1)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for module in (main_job, lab, experiments, notebooks):
        module.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.verbose:  # before anything starts: the actors and their children read it (labkit.compat.quiet)
        os.environ[quiet.VERBOSE_ENV] = "1"
    COMMAND[:] = argv
    ARGS.clear()
    ARGS.update({k: v for k, v in vars(args).items() if not callable(v)})
    STARTED.clear()
    if getattr(args, "out", None):
        start()  # a stored run's provenance is the code as it started
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit {args.cmd}: error: {e}", file=sys.stderr)
        return 2
