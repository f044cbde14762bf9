"""The `labkit` command line. Every subcommand with --json ends with one JSON object on the last stdout line."""

from __future__ import annotations

import argparse
import json
import sys
import time


def _emit(metrics: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(metrics, default=str), flush=True)
    else:
        for k, v in metrics.items():
            print(f"{k:<32} {v}")


def cmd_doctor(args) -> int:
    from labkit import doctor

    r = doctor.report()
    if not args.json:
        print(doctor.format_text(r))
    else:
        _emit(r, True)
    return 0


def cmd_demo(args) -> int:
    from labkit import demo

    _emit(demo.run(workdir=args.workdir, steps=args.steps, tp=args.tp, pp=args.pp), args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("doctor", help="versions, devices and active compat layers")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_doctor)

    d = sub.add_parser("demo", help="the main job on the embedded default")
    d.add_argument("--workdir", default="runs/demo")
    d.add_argument("--steps", type=int, default=20)
    d.add_argument("--tp", type=int, default=1)
    d.add_argument("--pp", type=int, default=1)
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
