"""`labkit notebook ...`: the command line of labkit.workbench.notebook (run, sweep, list, check); the usage is
that module's docstring. Calls go through the module (`nbk.run`, `nbk.sweep`), so what a test or a script puts in
its place is what the command runs."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from labkit.workbench import notebook as nbk


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit notebook", description=nbk.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    for action, help_ in (("run", "execute one notebook headless"), ("sweep", "one run per value of one parameter")):
        d = sub.add_parser(action, help=help_)
        d.add_argument("name", help=f"one of {', '.join(nbk.names())} (or its number)")
        d.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                       help="a parameter; for sweep, exactly one VALUE is a comma list v1,v2,...")
        d.add_argument("--out-root", default="runs")
        d.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
        d.add_argument("--json", action="store_true")
        if action == "sweep":
            d.add_argument("--over", default=None, metavar="KEY", help="the swept parameter (its VALUE is split on "
                           "commas; other comma values, e.g. -p SEEDS 0,1,2, pass whole); default: the one comma list")
            d.add_argument("--save", default=None, metavar="FILE", help="also write the command and every run's "
                           "whole record as JSON (e.g. data/<name>.json, for results that are quoted)")
    sub.add_parser("list", help="the notebooks")
    sub.add_parser("check", help="paired .py files in sync and outputs stripped")
    return p


def _emit(obj: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.flush()
        print(json.dumps(obj, default=str), flush=True)
    else:
        for k, v in obj.items():
            if k != "sweep/rows":
                print(f"{k:<40} {v}")


def _swept(param: list, over: str | None) -> str:
    """The swept key: --over KEY (which must be given with -p), else the only -p whose value is a comma list."""
    if over is not None:
        if over not in dict(param):
            raise ValueError(f"--over {over}: no -p {over} v1,v2,... gives its values")
        return over
    swept = [k for k, v in param if "," in v]
    if len(swept) != 1:
        raise ValueError(f"sweep needs exactly one -p KEY v1,v2,... or --over KEY (got {len(swept)} comma lists)")
    return swept[0]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "list":
        print("\n".join(nbk.names()))
        return 0
    if args.action == "check":
        problems = nbk.check_pairs()
        print("\n".join(problems) or f"{len(nbk.names())} notebooks paired and stripped")
        return 1 if problems else 0
    try:
        params = {k: nbk.parse_value(v) for k, v in args.param}
        if args.action == "run":
            m = nbk.run(args.name, params, out_root=args.out_root, timeout=args.timeout, progress=not args.json)
            _emit(m, args.json)
            if not args.json:
                print(f"\noutputs: {m['notebook/out_dir']}")
            return 0
        key = _swept(args.param, args.over)
        values = [nbk.parse_value(x.strip()) for x in dict(args.param)[key].split(",") if x.strip()]
        fixed = {k: v for k, v in params.items() if k != key}
        command = "labkit notebook " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        res = nbk.sweep(args.name, key, values, fixed, out_root=args.out_root, timeout=args.timeout,
                        save=args.save, command=command)
        _emit(res, args.json)
        return 1 if res["sweep/failed"] else 0
    except (ValueError, nbk.NotebookError) as e:
        print(f"labkit notebook {args.action}: error: {e}", file=sys.stderr)
        if args.json:
            _emit({"notebook/error": str(e)}, True)
        return 1 if isinstance(e, nbk.NotebookError) else 2


if __name__ == "__main__":
    sys.exit(main())
