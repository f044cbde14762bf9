"""Plotly figures of a soak (`labkit soak`, its JSON's `soak/series`): resident memory per process over syncs, and
sync end-to-end and pause time over syncs, faults marked. Pure, like labkit.workbench.viz."""

from __future__ import annotations

from labkit.workbench.viz import _color, _go


def memory(m: dict, title: str = "Soak: resident memory per process") -> object:
    """One line per process (role and pid: a restarted engine or trainer is a new line), MB over syncs; the
    warm-up end marked, after which each slope is judged (`soak/rss_per_process`)."""
    go, s = _go(), m["soak/series"]
    fig = go.Figure()
    for i, (name, pts) in enumerate(sorted(s["rss_mb"].items(), key=lambda kv: -kv[1][-1][1])):
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=name,
                                 line={"color": _color(i), "width": 1.5}))
    fig.add_vline(x=m["soak/warmup"], line_dash="dot", annotation_text="warm-up end")
    fig.update_layout(title=title, xaxis_title="sync", yaxis_title="resident MB", yaxis_type="log",
                      legend={"font": {"size": 9}})
    return fig


def sync_times(m: dict, title: str = "Soak: sync and pause time, faults marked") -> object:
    """End-to-end and pause seconds per sync (the driver's clock); a faulted sync is a marker named by its kind,
    the clean ones lines (the trend is judged on those, `soak/trend/*`)."""
    go, s = _go(), m["soak/series"]
    fig = go.Figure()
    clean = [i for i, f in enumerate(s["fault"]) if f is None]
    for key, name, color in (("e2e_s", "sync end to end", _color(0)), ("pause_s", "engine paused", _color(1))):
        fig.add_trace(go.Scatter(x=[s["sync"][i] for i in clean], y=[s[key][i] for i in clean], mode="lines",
                                 name=name, line={"color": color, "width": 1}))
    faulted = [i for i, f in enumerate(s["fault"]) if f is not None]
    fig.add_trace(go.Scatter(x=[s["sync"][i] for i in faulted], y=[s["e2e_s"][i] for i in faulted], mode="markers",
                             name="faulted sync", text=[s["fault"][i] for i in faulted],
                             hovertemplate="sync %{x}: %{text}, %{y:.2f} s", marker={"color": "crimson", "size": 7}))
    fig.add_vline(x=m["soak/warmup"], line_dash="dot", annotation_text="warm-up end")
    fig.update_layout(title=title, xaxis_title="sync", yaxis_title="seconds", yaxis_type="log")
    return fig
