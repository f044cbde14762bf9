"""`labkit notebook run|sweep|list|check`: the command line of labkit.workbench.notebook, whose docstring is the
usage. Calls go through that module (`nbk.run`, `nbk.sweep`), so what a test or a script puts in its place is what
the command runs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from labkit.cli.output import Output, command, emit, write_run
from labkit.config import add_arguments, check
from labkit.workbench import notebook as nbk


@dataclass(kw_only=True, slots=True, frozen=True)
class NotebookRunConfig:
    """`labkit notebook run` and `sweep`: where the runs go, how long a cell may take, what a sweep varies."""

    out_root: str = "runs"
    """Folder each run's folder is made under."""
    timeout: int = 1800
    """Seconds per cell."""
    over: str | None = None
    """The swept parameter KEY (its VALUE is split on commas; other comma values, e.g. -p SEEDS 0,1,2, pass whole);
    None: the one -p whose VALUE is a comma list."""
    save: str | None = None
    """Also write the command and every run's whole record to this JSON file (e.g. data/<name>.json, for results
    that are quoted)."""

    def __post_init__(self) -> None:
        check(isinstance(self.out_root, str) and self.out_root.strip() != "", "out_root", self.out_root,
              "a non-empty path")
        check(isinstance(self.timeout, int) and not isinstance(self.timeout, bool) and self.timeout >= 1, "timeout",
              self.timeout, "an integer >= 1 (seconds)")
        for name in ("over", "save"):
            v = getattr(self, name)
            check(v is None or (isinstance(v, str) and v.strip() != ""), name, v, "None or a non-empty string")


def _emit(obj: dict, as_json: bool) -> None:
    emit(obj, as_json, width=40, skip=("sweep/rows",))


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


def cmd_list(args) -> int:
    print("\n".join(nbk.names()))
    return 0


def cmd_check(args) -> int:
    problems = nbk.check_pairs()
    print("\n".join(problems) or f"{len(nbk.names())} notebooks paired and stripped")
    return 1 if problems else 0


def _run(args) -> int:
    params = {k: nbk.parse_value(v) for k, v in args.param}
    m = nbk.run(args.name, params, out_root=args.out_root, timeout=args.timeout, progress=not args.json)
    write_run(m, args.out)
    _emit(m, args.json)
    if not args.json:
        print(f"\noutputs: {m['notebook/out_dir']}")
    return 0


def _sweep(args) -> int:
    params = {k: nbk.parse_value(v) for k, v in args.param}
    key = _swept(args.param, args.over)
    values = [nbk.parse_value(x.strip()) for x in dict(args.param)[key].split(",") if x.strip()]
    fixed = {k: v for k, v in params.items() if k != key}
    res = nbk.sweep(args.name, key, values, fixed, out_root=args.out_root, timeout=args.timeout, save=args.save,
                    command=command())
    _emit(res, args.json)
    return 1 if res["sweep/failed"] else 0


def _guarded(run):
    """A bad parameter: exit 2; a notebook that failed: exit 1; either said on stderr (and as JSON with --json)."""
    def cmd(args) -> int:
        try:
            return run(args)
        except (ValueError, nbk.NotebookError) as e:
            print(f"labkit notebook {args.action}: error: {e}", file=sys.stderr)
            if args.json:
                _emit({"notebook/error": str(e)}, True)
            return 1 if isinstance(e, nbk.NotebookError) else 2
    return cmd


def add_commands(sub) -> None:
    """notebook run / sweep / list / check, with repeated `-p KEY VALUE`."""
    p = sub.add_parser("notebook", description=nbk.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="notebooks headless (papermill): run NAME [-p KEY VALUE]... | sweep NAME -p KEY v1,v2,... "
                            "| list | check")
    actions = p.add_subparsers(dest="action", required=True)
    for action, help_, run in (("run", "execute one notebook headless", _run),
                               ("sweep", "one run per value of one parameter", _sweep)):
        d = actions.add_parser(action, help=help_)
        d.add_argument("name", help=f"one of {', '.join(nbk.names())} (or its number)")
        d.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                       help="a parameter; for sweep, exactly one VALUE is a comma list v1,v2,...")
        add_arguments(d, NotebookRunConfig, ("out_root", "timeout") + (("over", "save") if action == "sweep" else ()))
        add_arguments(d, Output, ("json", "out") if action == "run" else ("json",))
        d.set_defaults(fn=_guarded(run))
    actions.add_parser("list", help="the notebooks").set_defaults(fn=cmd_list)
    actions.add_parser("check", help="paired .py files in sync and outputs stripped").set_defaults(fn=cmd_check)
