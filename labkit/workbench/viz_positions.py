"""Plotly figure of acceptance by position within a generation (labkit.mtp.positions): one line per arm with its
95 % interval over seeds, from the MTP experiment's summary. Pure, like labkit.workbench.viz."""

from __future__ import annotations

from labkit.mtp import positions
from labkit.workbench.viz import _color, _go


def by_position(m: dict, title: str = "Draft acceptance by position in the generation") -> object:
    """x: the bins of output positions (32 tokens each), y: the final step's acceptance per arm, mean over seeds
    with its 95 % interval as error bars; labkit's loop where the engine measured the whole generation
    (`mtp/final_loop_accept_rate_at_*`), else the run's own instrument."""
    go = _go()
    fig = go.Figure()
    for i, arm in enumerate(m["mtp/arms"]):
        prefix, names = positions.summary_bins(m, arm)
        if not names:
            continue
        keys = [f"{prefix}{b}_{arm}_mean" for b in names]
        names = [b.replace("_", "–") for b in names]
        ys = [m[k] for k in keys]
        cis = [m.get(k.removesuffix("_mean") + "_ci95") for k in keys]
        err = {"type": "data", "symmetric": False, "array": [c[1] - y if c else 0 for c, y in zip(cis, ys)],
               "arrayminus": [y - c[0] if c else 0 for c, y in zip(cis, ys)]}
        fig.add_trace(go.Scatter(x=names, y=ys, mode="lines+markers", name=arm, error_y=err,
                                 line={"color": _color(i)}))
    fig.update_layout(title=title, xaxis_title="output positions (tokens)", yaxis_title="accept rate",
                      yaxis_range=[0, 1])
    return fig
