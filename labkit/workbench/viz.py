"""Plotly figures from labkit's metric dicts. Pure: data in, `go.Figure` out; `save` writes them to disk.

Every builder takes the dicts the library already returns (`wb.sync(...)`, `tune.sweep`, train history,
acceptance history), so notebooks, the CLI and sweeps draw the same pictures.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from labkit.mtp import summary
from labkit.mtp.acceptance import expected_accept_length

if TYPE_CHECKING:  # plotly is imported lazily: `import labkit.workbench.viz` stays cheap
    import plotly.graph_objects as go

MB = 1 << 20
# Every phase a sync's wall time is spent in (labkit.sync.inflight.PHASES); setup (plan, buffers, transport) is
# paid in full only by a cold sync (`sync/cold`), so it is drawn and named as the one-off it is.
PHASES = ("gather", "quantize", "pack", "encode", "transfer", "load", "verify", "stage", "session", "setup")
PHASE_NAMES = {"setup": "setup (one-off)", "session": "session (fixed calls)"}


def _go():
    import plotly.graph_objects as go

    return go


def sync_phases(runs: list[dict], labels: list[str] | None = None, title: str = "Sync time per phase") -> go.Figure:
    """Stacked per-phase seconds, one bar per sync (per transport or per bucket size), wall total as a marker.

    Phases overlap (the next bucket is packed while this one loads), so the stack can exceed the wall total.
    """
    go = _go()
    labels = labels or [run_label(m) for m in runs]
    fig = go.Figure()
    for ph in PHASES:
        ys = [m.get(f"timing/sync/{ph}", 0.0) for m in runs]
        per_bucket = [1e3 * y / max(1, m.get("sync/num_buckets", 1)) for y, m in zip(ys, runs)]
        fig.add_bar(name=PHASE_NAMES.get(ph, ph), x=labels, y=ys, customdata=per_bucket,
                    hovertemplate=f"{ph}: %{{y:.4f}} s (%{{customdata:.3f}} ms per bucket)<extra></extra>")
    fig.add_scatter(name="wall total", x=labels, y=[m.get("timing/sync/total") for m in runs], mode="markers",
                    marker=dict(symbol="line-ew-open", size=28, color="black", line=dict(width=3, color="black")))
    fig.update_layout(barmode="stack", title=title, yaxis_title="seconds", legend_title="phase")
    return fig


def run_label(m: dict) -> str:
    t = m.get("sync/transport", "?") + (" (SGLang's loader)" if m.get("sync/engine_loader") == "sglang" else "")
    warm = {True: ", cold", False: ", warm"}.get(m.get("sync/cold"), "")
    if t == "per-tensor":
        return f"per-tensor ({m.get('sync/num_buckets', '?')} calls{warm})"
    return f"{t} @ {fmt_bytes(m.get('sync/bucket_bytes', 0))} ({m.get('sync/num_buckets', '?')} buckets{warm})"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", MB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def bucket_sweep(curve: list[dict], chosen_bytes: int | None = None, budget_bytes: int | None = None,
                 trials: list[dict] | None = None, title: str = "Bucket size: sync time and memory") -> go.Figure:
    """Time and peak extra memory vs bucket size (log x); the chosen bucket and the memory budget marked.

    `curve` rows: {"bucket_bytes", "seconds", "peak_extra_bytes"} (tune.sweep); `trials` (autotune) are
    overlaid as open markers so the search path is visible against the full curve.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("sync time", "peak extra memory"))
    rows = sorted(curve, key=lambda r: r["bucket_bytes"])
    x = [r["bucket_bytes"] / MB for r in rows]
    fig.add_scatter(x=x, y=[r["seconds"] for r in rows], mode="lines+markers", name="sweep", row=1, col=1)
    fig.add_scatter(x=x, y=[(r.get("peak_extra_bytes") or 0) / MB for r in rows], mode="lines+markers",
                    name="peak extra", row=2, col=1)
    if rows:
        best = min(rows, key=lambda r: r["seconds"])
        fig.add_scatter(x=[best["bucket_bytes"] / MB], y=[best["seconds"]], mode="markers", name="sweep best",
                        marker=dict(symbol="star", size=14, color="gold", line=dict(width=1, color="black")),
                        row=1, col=1)
    if trials:
        fig.add_scatter(x=[t["bucket_bytes"] / MB for t in trials], y=[t["seconds"] for t in trials],
                        mode="markers", name="autotune trials", marker=dict(symbol="circle-open", size=12),
                        row=1, col=1)
    if chosen_bytes:
        for r in (1, 2):
            fig.add_vline(x=chosen_bytes / MB, line=dict(color="green", dash="dash"), row=r, col=1)
        # Inside the plot, right of the line: above it ("bottom" anchor at y=1) it sat on the subplot title.
        fig.add_annotation(x=_log10(chosen_bytes / MB), y=0.97, yref="y domain",
                           text=f"chosen {fmt_bytes(chosen_bytes)}", showarrow=False, font=dict(color="green"),
                           yanchor="top", xanchor="left", xshift=4, row=1, col=1)
    if budget_bytes:
        fig.add_hline(y=budget_bytes / MB, line=dict(color="red", dash="dot"), row=2, col=1,
                      annotation_text=f"memory budget {fmt_bytes(budget_bytes)}", annotation_position="top left")
    fig.update_xaxes(type="log", title_text="bucket size (MiB)", row=2, col=1)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="MiB", row=2, col=1)
    fig.update_layout(title=title, height=560)
    return fig


def _log10(x: float) -> float:
    import math

    return math.log10(x)  # annotations on a log axis take log10 coordinates


def curves(history: list[dict], keys: list[str] | None = None, x: str = "step", title: str = "Training") -> go.Figure:
    """One line per metric key over steps (train/RL history: a list of per-step dicts)."""
    go = _go()
    keys = keys or [k for k in (history[0] if history else {}) if k != x and _num(history[0][k])]
    fig = go.Figure()
    for k in keys:
        pts = [(h.get(x, i), h[k]) for i, h in enumerate(history) if _num(h.get(k))]
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=k)
    fig.update_layout(title=title, xaxis_title=x, yaxis_title="value")
    return fig


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _band(fig, steps, ci, color, arm, col) -> None:
    """A shaded 95 % band between the interval's ends (steps without an interval, e.g. one seed, get none)."""
    pts = [(s, c) for s, c in zip(steps, ci) if c]
    if not pts:
        return
    xs = [p[0] for p in pts] + [p[0] for p in reversed(pts)]
    ys = [p[1][1] for p in pts] + [p[1][0] for p in reversed(pts)]
    fig.add_scatter(x=xs, y=ys, fill="toself", fillcolor=color, opacity=0.15, line=dict(width=0), hoverinfo="skip",
                    legendgroup=arm, showlegend=False, row=1, col=col)


def acceptance(history: list[dict], title: str = "MTP draft acceptance under RL") -> go.Figure:
    """Per arm over RL steps, the mean over seeds with a 95 % band: measured accept rate (solid) and its offline
    estimate (dotted), reward, and accept length against the theory E = (1 - a^(k+1)) / (1 - a) at the
    measured per-position-1 rate.

    history rows (labkit.mtp.experiment): {"arm", "seed", "step", "mtp/accept_rate", "mtp/accept_length",
    "mtp/offline_accept_rate", "mtp/accept_rate_pos_1", "train/reward", ...}.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("accept rate", "reward", "accept length vs theory"))
    arms = list(dict.fromkeys(h["arm"] for h in history))
    per_arm = summary.curves([{"seed": 0, **h} for h in history], arms)
    k = sum(1 for key in history[0] if key.startswith("mtp/accept_rate_pos_")) if history else 0
    for i, arm in enumerate(arms):
        pts, color = per_arm[arm], _color(i)
        steps, line = [p["step"] for p in pts], dict(color=color)
        for col, name in ((1, "accept_rate"), (2, "reward"), (3, "accept_length")):
            _band(fig, steps, [p[f"{name}_ci95"] for p in pts], color, arm, col)
            fig.add_scatter(x=steps, y=[p[name] for p in pts], mode="lines+markers", name=arm, legendgroup=arm,
                            showlegend=col == 1, line=line, row=1, col=col)
        off = [(p["step"], p["offline_accept_rate"]) for p in pts if _num(p.get("offline_accept_rate"))]
        if off:
            fig.add_scatter(x=[p[0] for p in off], y=[p[1] for p in off], mode="lines", name=f"{arm} (offline)",
                            legendgroup=arm, line=dict(color=color, dash="dot"), row=1, col=1)
        if k:
            rows = [h for h in history if h["arm"] == arm]
            theory = {s: [expected_accept_length(h["mtp/accept_rate_pos_1"], k) for h in rows if h["step"] == s]
                      for s in steps}
            fig.add_scatter(x=steps, y=[sum(v) / len(v) for v in theory.values()], mode="lines", legendgroup=arm,
                            showlegend=False, line=dict(color=color, dash="dot"), row=1, col=3)
    for c in (1, 2, 3):
        fig.update_xaxes(title_text="RL step", row=1, col=c)
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="tokens per verify", row=1, col=3)
    fig.update_layout(title=title)
    return fig


def per_position(m: dict, title: str = "Speculative decoding with the MTP draft") -> go.Figure:
    """P(draft i accepted | drafts < i were), bars, from `labkit.mtp.experiment.speculate` metrics; the title
    carries accept length measured vs the theory E = (1 - a^(k+1)) / (1 - a) at the depth-1 rate."""
    go = _go()
    k = sum(1 for key in m if key.startswith("mtp/accept_rate_pos_"))
    pos = list(range(1, k + 1))
    fig = go.Figure(go.Bar(x=pos, y=[m[f"mtp/accept_rate_pos_{i}"] for i in pos], name="measured"))
    fig.update_layout(title=f"{title}: accept length {m['mtp/accept_length']:.3f} "
                            f"(theory {m.get('mtp/theory_accept_length', float('nan')):.3f}), k={k}",
                      xaxis_title="draft position", yaxis_title="accept rate", yaxis_range=[0, 1])
    return fig


def _color(i: int) -> str:
    import plotly.colors

    pal = plotly.colors.qualitative.Plotly
    return pal[i % len(pal)]


def logprob_agreement(groups: dict, title: str = "Log-prob agreement: trainer vs engine") -> go.Figure:
    """Per-token log-probs, trainer (x) vs engine (y), one marker group per situation, with the y = x line.

    groups: {label: {"trainer": [...], "engine": [...]}} as returned by experiments.logprob_agreement.
    """
    go = _go()
    fig = go.Figure()
    xs, ys = [], []
    for label, g in groups.items():
        fig.add_scatter(x=g["trainer"], y=g["engine"], mode="markers", name=label, opacity=0.7)
        xs += list(g["trainer"])
        ys += list(g["engine"])
    if xs:
        lo, hi = min(min(xs), min(ys)), max(max(xs), max(ys))
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="gray", dash="dot"))
    fig.update_layout(title=title, xaxis_title="trainer log-prob", yaxis_title="engine log-prob")
    return fig


def sweep_summary(rows: list[dict], key: str, metrics: list[str], title: str | None = None) -> go.Figure:
    """One panel per metric against the swept parameter's values (labkit notebook sweep); a `<m>_mean` metric
    whose rows carry `<m>_ci95` ([low, high]) gets error bars."""
    from plotly.subplots import make_subplots

    metrics = metrics or ["notebook/seconds"]
    fig = make_subplots(rows=len(metrics), cols=1, subplot_titles=metrics, shared_xaxes=True)
    xs = [str(r.get(key)) for r in rows]
    for i, k in enumerate(metrics, start=1):
        ys = [r.get(k) for r in rows]
        cis = [r.get(k[:-len("_mean")] + "_ci95") if k.endswith("_mean") else None for r in rows]
        err = None
        if any(isinstance(c, list) for c in cis):
            err = dict(type="data", symmetric=False,
                       array=[c[1] - y if isinstance(c, list) and y is not None else None for c, y in zip(cis, ys)],
                       arrayminus=[y - c[0] if isinstance(c, list) and y is not None else None
                                   for c, y in zip(cis, ys)])
        fig.add_scatter(x=xs, y=ys, error_y=err, mode="lines+markers", name=k, row=i, col=1)
    fig.update_xaxes(title_text=key, type="category", row=len(metrics), col=1)
    fig.update_layout(title=title or f"sweep over {key}", height=220 + 200 * len(metrics), showlegend=False)
    return fig


def _err(pairs: list) -> dict:
    """Asymmetric error bars from (mean, [low, high] or None) pairs."""
    return dict(type="data", symmetric=False, array=[c[1] - m if c else 0 for m, c in pairs],
                arrayminus=[m - c[0] if c else 0 for m, c in pairs])


def draft_schedules(rows: list[dict], title: str = "MTP draft: what it learns and when") -> go.Figure:
    """Last-quarter acceptance per draft schedule (objective · cadence) and its paired difference from the frozen
    draft, both with 95 % intervals over seeds (rows: labkit.lab.report.mtp.draft_rows)."""
    from plotly.subplots import make_subplots

    labels = [f"{r['objective']} · {r['cadence']}" for r in rows]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("last-quarter accept rate", "minus frozen (paired by seed)"))
    for col, key in ((1, "tail"), (2, "diff_tail")):
        pairs = [r[key] for r in rows]
        fig.add_scatter(x=[m for m, _ in pairs], y=labels, error_x=_err(pairs), mode="markers",
                        marker=dict(size=9, color=_color(col - 1)), showlegend=False, row=1, col=col)
    fig.add_vline(x=0.0, line_dash="dot", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title, height=160 + 42 * len(rows), width=980, margin=dict(l=330))
    return fig


def save(fig, path_without_ext: str | Path) -> dict:
    """Write `<path>.html` always (plotly.js beside it, so it opens offline) and `<path>.png` when kaleido and a
    Chromium it can drive are available. Returns {"html": path, "png": path or None, "png_skipped": reason}."""
    base = Path(path_without_ext)
    base.parent.mkdir(parents=True, exist_ok=True)
    html = base.with_suffix(".html")
    fig.write_html(html, include_plotlyjs="directory")
    out = {"html": str(html), "png": None, "png_skipped": None}
    try:
        import kaleido  # noqa: F401
    except ImportError:
        out["png_skipped"] = "kaleido is not installed (pip install kaleido; it drives a local Chromium)"
        return out
    try:
        fig.write_image(base.with_suffix(".png"))
        out["png"] = str(base.with_suffix(".png"))
    except Exception as e:  # kaleido present but no browser it can start: HTML is enough
        out["png_skipped"] = f"kaleido could not render: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return out
