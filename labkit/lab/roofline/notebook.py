"""The sync roofline for notebook 05 and `labkit roofline` (labkit.cli.lab): tables, the bucket what-if figure, the run.

    labkit roofline [--model M] [--weights W] [--hardware H] [--bucket-mb N] [layout flags] [--json] [--out F]

The numbers come from labkit.lab.roofline.bounds (pure); this module shows them (HTML tables, a plotly figure), saves
them under $LABKIT_OUT when a notebook runner set it, and writes the run behind the README's roofline tables
(`labkit roofline --json --out data/roofline_published.json`, then `labkit report`).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from pathlib import Path

from labkit.lab.roofline import bounds as rf
from labkit.lab.roofline import published as rp
from labkit.models.real import REAL
from labkit.lab.roofline.tensors import model_tensors

MB = rf.MB
REFERENCE = rf.Scenario(hardware="H100", layout=rf.Layout(trainer_gpus=8, engine_gpus=8, engine_tp=8), bucket_mb=512)


def overheads(show: bool = True) -> rf.Overheads:
    """The CPU-measured overheads (labkit.lab.roofline.bounds.cpu_overheads), printed with their arithmetic."""
    over = rf.cpu_overheads()
    if show:
        print(f"{over.measured_on}\n{over.derivation}")
    return over


def model_summary(name: str, s: rf.Scenario, over: rf.Overheads, repeats: list[rf.Overheads] = ()) -> dict:
    """A shipped model's size and its bounds on `s.hardware` at its reference layout
    (labkit.lab.roofline.bounds.reference_layout), for the README's models table; with `repeats` (one fit per stored
    bench pair, `rf.cpu_overheads_repeats`) also the range the predicted colocated time spans over them."""
    full, bare, fp8 = model_tensors(name, "bf16"), model_tensors(name, "bf16", mtp=False), model_tensors(name, "fp8")
    layout = rf.reference_layout(full, rf.hardware(s.hardware))
    at = dataclasses.replace(s, model=name, layout=layout)
    rows = {r["transport"]: r for r in rf.transport_rows(at, over, full)}
    spread = [{r["transport"]: r for r in rf.transport_rows(at, o, full)}["colocated"]["predicted_s"]
              for o in repeats]
    return {"name": name, "label": full.label, "layout": dataclasses.asdict(layout), "params": full.params,
            "mtp_params": full.params - bare.params,
            "tensors": full.num_tensors, "expert_tensors": full.expert_tensors, "bf16_bytes": full.total_bytes,
            "fp8_bytes": fp8.total_bytes, "buckets": rows["colocated"]["buckets"],
            **{f"bound_s/{t}": rows[t]["bound_s"] for t in rf.LINKS},
            "predicted_s/colocated": rows["colocated"]["predicted_s"],
            **({"predicted_s/colocated_range": [min(spread), max(spread)]} if spread else {})}


def run(s: rf.Scenario = REFERENCE, over: rf.Overheads | None = None) -> dict:
    """Everything the README's roofline tables and `labkit roofline --json` show, as one JSON-ready dict."""
    cpu = over is None
    repeats = rf.cpu_overheads_repeats() if cpu else []  # the CPU fits' spread: for the CPU fit only
    over = over or rf.cpu_overheads()
    e2e = rf.cpu_overheads(measure="end_to_end") if cpu else None
    hash_gbps = rf.gpu_hash_gbps() if cpu else None
    ref = dataclasses.replace(REFERENCE, model=next(iter(REAL)))
    fields = ("per_bucket_s", "per_tensor_s", "per_call_s", "per_sync_s", "measured_on", "derivation")
    return {
        "roofline/scenario": {**{f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "layout"},
                              "layout": dataclasses.asdict(s.layout)},
        "roofline/overheads": {k: getattr(over, k) for k in fields},
        **({"roofline/overheads_end_to_end": {k: getattr(e2e, k) for k in fields},
            "roofline/fit_residuals": {m: rf.cpu_residuals(m) for m in ("transport_only", "end_to_end")}}
           if cpu else {}),
        "roofline/hardware": {k: dataclasses.asdict(h) for k, h in rf.HARDWARE.items()},
        "roofline/reference": {"hardware": ref.hardware, "weights": ref.weights, "bucket_mb": ref.bucket_mb,
                               "trainer_bytes_per_param": rf.TRAINER_BYTES_PER_PARAM},
        "roofline/overheads_repeats": [{k: getattr(o, k) for k in ("per_bucket_s", "per_tensor_s", "per_sync_s")}
                                       for o in repeats],
        "roofline/models": [model_summary(n, ref, over, repeats) for n in REAL],
        "roofline/transports": rf.transport_rows(s, over),
        "roofline/published": rp.published_rows(e2e, hash_gbps),
    }


# ---------------------------------------------------------------------------------------------- notebook
def transport_table(s: rf.Scenario, over: rf.Overheads) -> list[dict]:
    """The transports for `s`, as table rows (bound and predicted), recorded as metrics under roofline/."""
    from labkit.workbench import nb

    mt = s.tensors()
    rows = rf.transport_rows(s, over, mt)
    nb.record({"roofline/model": mt.label, "roofline/bytes": mt.total_bytes, "roofline/tensors": mt.num_tensors,
               "roofline/params": mt.params, "roofline/overheads_measured_on": over.measured_on,
               **{f"roofline/bound_s/{r['transport']}": r["bound_s"] for r in rows},
               **{f"roofline/predicted_s/{r['transport']}": r["predicted_s"] for r in rows}})
    print(f"{mt.label}: {mt.params / 1e9:.2f} B parameters, {mt.num_tensors} tensors "
          f"({mt.expert_tensors} expert), {mt.total_bytes / rf.GB:.2f} GB in {s.weights}; {s.hardware}, "
          f"{s.bucket_mb:g} MiB buckets. Predicted = bound + {over.measured_on}.")
    return [{"transport": r["transport"], "bound": rf.fmt_seconds(r["bound_s"]), "limit": r["formula"],
             "buckets": r["buckets"], "tensors": r["tensors"], "overheads": rf.fmt_seconds(r["overhead_s"]),
             "predicted": rf.fmt_seconds(r["predicted_s"])} for r in rows]


def published_table() -> list[dict]:
    """The published systems beside their bound and, where a bucket size is published, the time predicted with
    labkit's end-to-end overheads; recorded as roofline/published."""
    from labkit.workbench import nb

    rows = rp.published_rows(rf.cpu_overheads(measure="end_to_end"), rf.gpu_hash_gbps())
    nb.record({"roofline/published": rows})
    return [{"system": r["system"], "model": r["model"], "hardware": r["hardware"], "mode": r["mode"],
             "published": r["published"], "bytes per sync": _bytes(r), "bound": r["bound"],
             "fraction of its limit": f"{r['fraction_of_limit']:.2%}",
             "predicted end to end": rf.fmt_seconds(r["predicted_s"]) if "predicted_s" in r else "–",
             "assumption": r["assumption"], "source": r["source"]} for r in rows]


def show_rows(rows: list[dict], name: str | None = None, title: str = "") -> None:
    """Display rows as an HTML table; save `<name>.json` and `<name>.html` under $LABKIT_OUT when set."""
    from IPython.display import HTML, display

    page = _table_html(rows, title)
    out = os.environ.get("LABKIT_OUT")
    if name and out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(rows, indent=1, default=str))
        (Path(out) / f"{name}.html").write_text(f"<!doctype html><meta charset='utf-8'>{page}")
    display(HTML(page))


def _table_html(rows: list[dict], title: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0]) if rows else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return (f"<h4>{html.escape(title)}</h4>" if title else "") + f"<table><tr>{head}</tr>{body}</table>"


def whatif_figure(s: rf.Scenario, over: rf.Overheads, min_mb: float = 1.0, max_mb: float = 8192.0,
                  curve_path: str | Path = rf.ROOT / "data" / "notebook04_bench_cpu.json",
                  bench_path: str | Path = rf.ROOT / "data" / "bench_sync_cpu.json"):
    """Left: predicted sync time against bucket size at scale, per transport, with each bound dashed. Right: the
    CPU-measured curve it extrapolates from (notebook 04, bench model, colocated) and the fitted overhead line."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    from labkit.workbench import nb

    mt, sizes = s.tensors(), _sizes(min_mb, max_mb)
    pts = rf.whatif(s, over, sizes, mt)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, column_widths=[0.62, 0.38], subplot_titles=(
        f"at scale: {mt.label} {s.weights}, {s.layout.engine_gpus}×{s.hardware}",
        "measured on CPU: bench model, colocated"))
    x = [p["bucket_bytes"] / MB for p in pts]
    for i, t in enumerate(rf.LINKS):
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        fig.add_scatter(x=x, y=[p[t] for p in pts], mode="lines+markers", name=f"{t} predicted",
                        line=dict(color=color), customdata=[p["buckets"] for p in pts],
                        hovertemplate="%{x:.4g} MiB: %{y:.3g} s (%{customdata} buckets)<extra></extra>", row=1, col=1)
        fig.add_scatter(x=[x[0], x[-1]], y=[pts[0][f"bound/{t}"]] * 2, mode="lines", name=f"{t} bound",
                        line=dict(color=color, dash="dash"), row=1, col=1)
    fig.add_vline(x=s.bucket_mb, line=dict(color="gray", dash="dot"), row=1, col=1)
    _cpu_panel(fig, over, json.loads(Path(curve_path).read_text()), json.loads(Path(bench_path).read_text()))
    fig.update_xaxes(type="log", title_text="bucket size (MiB)")
    fig.update_yaxes(type="log", title_text="seconds per sync", row=1, col=1)
    fig.update_yaxes(title_text="weight-moving seconds", row=1, col=2)
    fig.update_layout(title="What-if for bucket size: predicted = bound + overheads measured on a CPU box (not a GPU)",
                      height=600, width=1100, legend=dict(orientation="h", y=-0.18))
    nb.record({"roofline/whatif": pts})
    return fig


def explorer(s: rf.Scenario, over: rf.Overheads, min_mb: float = 1.0, max_mb: float = 8192.0):
    """INTERACTIVE: model / weights / hardware dropdowns and a bucket slider; Run redraws the table and the figure
    (pure arithmetic, no GPU; the biggest models take a few seconds). Returns the box on screen."""
    import ipywidgets as W
    from IPython.display import display

    from labkit.config import choices
    from labkit.lab.roofline.tensors import names

    model = W.Dropdown(options=list(dict.fromkeys([s.model, *names()])), value=s.model, description="model")
    weights = W.Dropdown(options=choices(rf.Scenario, "weights"), value=s.weights, description="weights")
    hw = W.Dropdown(options=list(rf.HARDWARE), value=s.hardware, description="hardware")
    bucket = W.SelectionSlider(options=[size / MB for size in _sizes(min_mb, max_mb)], value=_nearest(s.bucket_mb,
                               min_mb, max_mb), description="bucket MiB", continuous_update=False)
    button, out = W.Button(description="Run", button_style="primary"), W.Output()

    def on_run(_):
        # Set as display_data bundles, not `with out:` (which captures nothing off the kernel's main thread).
        new = dataclasses.replace(s, model=model.value, weights=weights.value, hardware=hw.value,
                                  bucket_mb=bucket.value)
        fig = whatif_figure(new, over, min_mb, max_mb)
        out.outputs = tuple({"output_type": "display_data", "metadata": {}, "data": d} for d in (
            {"text/html": _table_html(transport_table(new, over)), "text/plain": "transport bounds"},
            {"application/vnd.plotly.v1+json": {**json.loads(fig.to_json()), "config": {}},
             "text/plain": f"<Figure: {fig.layout.title.text}>"}))

    button.on_click(on_run)
    box = W.VBox([W.HBox([model, weights, hw]), W.HBox([bucket, button]), out])
    display(box)
    return box


def _nearest(mb: float, min_mb: float, max_mb: float) -> float:
    return min((size / MB for size in _sizes(min_mb, max_mb)), key=lambda v: abs(v - mb))


def _cpu_panel(fig, over: rf.Overheads, curve_run: dict, bench_run: dict) -> None:
    """The fit `rf.fit_overheads` made: two copies of the bytes at the run's memcpy rate + the sync + tensors +
    buckets."""
    bench = model_tensors("bench", "fp32")
    rows = sorted(curve_run["tune/curve"], key=lambda r: r["bucket_bytes"])
    x = [r["bucket_bytes"] / MB for r in rows]
    fixed = (over.per_sync_s + bench.num_tensors * over.per_tensor_s
             + 2 * bench.total_bytes / (bench_run["bench/memcpy_gbps"] * rf.GB))
    fig.add_scatter(x=x, y=[r["seconds"] for r in rows], mode="markers", name="CPU measured (notebook 04)",
                    marker=dict(color="black", size=9), row=1, col=2)
    fig.add_scatter(x=x, y=[fixed + over.per_bucket_s * rf.count_buckets(bench.tensors, r["bucket_bytes"])
                            for r in rows], mode="lines", name="fitted: bytes + sync + tensors + buckets",
                    line=dict(color="black", dash="dot"), row=1, col=2)


def _sizes(min_mb: float, max_mb: float) -> list[int]:
    if not 0 < min_mb <= max_mb:
        raise ValueError(f"min_mb={min_mb!r}, max_mb={max_mb!r} are invalid: expected 0 < min_mb <= max_mb")
    out, x = [], float(min_mb)
    while x <= max_mb * 1.0001:
        out.append(int(x * MB))
        x *= 2
    return out


def _bytes(r: dict) -> str:
    return "not published" if r["bytes"] is None else f"{r['bytes'] / rf.GB:.1f} GB {r['weights']}"

