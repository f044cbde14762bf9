"""The few helpers every notebook uses: record metrics, report the environment, validate parameters, show figures.

Notebooks record numbers through `record` only, so tests and sweeps read a JSON file instead of cell text.
`labkit.workbench.notebook.run` points `LABKIT_METRICS` (the JSON file) and `LABKIT_OUT` (figures) into its run folder;
in an interactive session both are unset and metrics stay in memory.
"""

from __future__ import annotations

import difflib
import json
import os
import types
from dataclasses import dataclass
from pathlib import Path

from labkit.config import choices

_METRICS: dict = {}


def _jsonable(x):
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def record(key_or_dict: str | dict, value=None) -> None:
    """Record one metric (`record("sync/verified", True)`) or many (`record(metrics_dict)`); `metrics()` reads them."""
    items = dict(key_or_dict) if isinstance(key_or_dict, dict) else {key_or_dict: value}
    # Round-trip through JSON now so a value that cannot be stored fails here, not at the end of a long run.
    _METRICS.update(json.loads(json.dumps(items, default=_jsonable)))
    path = os.environ.get("LABKIT_METRICS")
    if path:
        # The whole dict, written atomically: a kernel that dies mid-run leaves the last complete record.
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(_METRICS, indent=1, sort_keys=True))
        os.replace(tmp, path)


def metrics() -> dict:
    return dict(_METRICS)


def env_report(show: bool = True) -> dict:
    """`labkit doctor` plus where this run's outputs go; printed so every executed notebook carries it."""
    from labkit import doctor

    r = doctor.report()
    r.update({"labkit_metrics": os.environ.get("LABKIT_METRICS"), "labkit_out": os.environ.get("LABKIT_OUT")})
    if show:
        print(doctor.format_text(r))
        print(f"{'outputs':<14} {r['labkit_out'] or '(interactive: metrics kept in memory)'}")
    return r


# ---------------------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Int:
    lo: int | None = None
    hi: int | None = None

    def ok(self, v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and _in(v, self.lo, self.hi)

    def __str__(self) -> str:
        return f"an integer{_range(self.lo, self.hi)}"


@dataclass(frozen=True)
class Float:
    lo: float | None = None
    hi: float | None = None

    def ok(self, v) -> bool:  # ints are fine where a float is asked for (papermill's `-p X 1` gives an int)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and _in(v, self.lo, self.hi)

    def __str__(self) -> str:
        return f"a number{_range(self.lo, self.hi)}"


@dataclass(frozen=True)
class Choice:
    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", values)

    @classmethod
    def of(cls, config: type, field: str, exclude: tuple = ()):
        """The values a config's `Literal` field allows (less `exclude`): a notebook restates none of them."""
        return cls(*(c for c in choices(config, field) if c is not None and c not in exclude))

    def ok(self, v) -> bool:
        return any(v == c and type(v) is type(c) for c in self.values)

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.values)


@dataclass(frozen=True)
class Bool:
    def ok(self, v) -> bool:
        return isinstance(v, bool)

    def __str__(self) -> str:
        return "True or False"


@dataclass(frozen=True)
class Str:
    def ok(self, v) -> bool:
        return isinstance(v, str)

    def __str__(self) -> str:
        return "a string"


@dataclass(frozen=True)
class Subset:
    """A comma-separated string of one or more allowed items, e.g. "joint,frozen_draft"."""

    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", values)

    of = classmethod(Choice.of.__func__)

    def ok(self, v) -> bool:
        items = v.split(",") if isinstance(v, str) else []
        return bool(items) and all(x.strip() in self.values for x in items)

    def __str__(self) -> str:
        return "a comma-separated list of " + ", ".join(repr(c) for c in self.values)


@dataclass(frozen=True)
class Ints:
    """A comma-separated string of distinct integers >= 0, e.g. "0,1,2" (seeds)."""

    def ok(self, v) -> bool:
        items = [x.strip() for x in v.split(",")] if isinstance(v, str) else []
        return bool(items) and all(x.isdigit() for x in items) and len(set(map(int, items))) == len(items)

    def __str__(self) -> str:
        return "a comma-separated list of distinct integers >= 0"


def _in(v, lo, hi) -> bool:
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    return f" >= {lo}" if lo is not None else (f" <= {hi}" if hi is not None else "")


# Names IPython puts in a notebook's globals; everything else public that is not a module, class or function
# was set by the parameters cell or injected by papermill.
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


def user_params(namespace: dict) -> dict:
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and k not in _IPYTHON_NAMES
            and not isinstance(v, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))}


def check_params(params: dict, spec: dict) -> dict:
    """Validate notebook parameters against `spec` ({name: Int(..) | Float(..) | Choice(..) | Bool() | Str()}).

    `params` may be the notebook's `globals()`: modules, functions, classes and private/IPython names are skipped,
    so a misspelt `-p steps 3` shows up as an unknown parameter. Raises ValueError naming the parameter, the bad
    value and what is allowed; returns the validated parameters.
    """
    params = user_params(params)
    for name in params:
        if name not in spec:
            close = difflib.get_close_matches(name.upper(), list(spec), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown parameter {name!r}{hint}: expected one of {', '.join(spec)}")
    for name, rule in spec.items():
        if name not in params:
            raise ValueError(f"parameter {name!r} is missing: the parameters cell must define it ({rule})")
        if not rule.ok(params[name]):
            raise ValueError(f"{name}={params[name]!r} is invalid: expected {rule}")
    return {k: params[k] for k in spec}


# ---------------------------------------------------------------------------------------------- figures
def show(fig, name: str | None = None, interactive: bool = False) -> None:
    """Display `fig`; save it under $LABKIT_OUT as `name` (HTML, PNG when possible) when a runner set one.

    Headless runs display the plain figure, which papermill stores as `application/vnd.plotly.v1+json`.
    Interactive sessions get a FigureWidget when anywidget is installed (plotly >= 6 needs it), else the
    same plain figure, which JupyterLab renders interactively too.
    """
    from IPython.display import display

    out = os.environ.get("LABKIT_OUT")
    if name and out:
        from labkit.workbench import viz

        viz.save(fig, Path(out) / name)
    shown = fig
    if interactive:
        try:
            import anywidget  # noqa: F401
            import plotly.graph_objects as go

            shown = go.FigureWidget(fig)
        except ImportError:
            pass
    display(shown)
