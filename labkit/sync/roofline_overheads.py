"""Software costs a sync pays on top of moving bytes, for the roofline's predicted time (labkit.sync.roofline).

The defaults are labkit's own measurements on its 2-core CPU box, fitted from two stored runs of the same 307-tensor
`bench` model: `labkit bench sync` (data/bench_sync_cpu.json: per-tensor, colocated and a memcpy, one bucket size)
and notebook 04's colocated sweep over nine bucket sizes (data/notebook04_bench_cpu.json). One run alone cannot
tell a per-bucket cost from a per-tensor one (a bucketed sync has the same tensors at every size); the sweep can.
They are CPU-measured and every output says so: on GPUs plug in your own (`Overheads(...)`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.config import check
from labkit.sync.roofline_models import count_buckets, model_tensors

GB = 1e9
DATA = Path(__file__).resolve().parents[2] / "data"


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Software costs a sync pays on top of moving bytes; the predicted time is bound + these."""

    per_bucket_s: float
    """One bucket: the engine call, handles, the plan's bookkeeping (serial: one engine's calls in sequence)."""
    per_tensor_s: float
    """One tensor inside a bucketed sync: export, pack slice, copy-plan entry."""
    per_call_s: float
    """One call of the per-tensor transport (one tensor per engine call), for the baseline row."""
    measured_on: str = "given"
    """Where these were measured; every table that uses them says it."""
    derivation: str = ""
    """The arithmetic behind them."""

    def __post_init__(self) -> None:
        for f in ("per_bucket_s", "per_tensor_s", "per_call_s"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, f, v, "seconds >= 0")


def fit_overheads(bench: dict, curve_run: dict) -> Overheads:
    """Overheads from `labkit bench sync` (`bench`) and notebook 04's colocated sweep of the same 307-tensor
    model (`curve_run`): weight-moving seconds against the planner's bucket count is a line; its slope is the
    per-bucket cost, its intercept less two copies of the bytes (pack + apply at the run's memcpy rate) is the
    per-tensor cost; the per-tensor transport's seconds less one copy, per tensor, is the per-call cost."""
    bench_model = model_tensors("bench", "fp32")
    n, nbytes = bench["bench/num_tensors"], bench["bench/model_bytes"]
    check(n == bench_model.num_tensors and nbytes == bench_model.total_bytes, "bench", bench.get("command"),
          f"a run of labkit's bench model ({bench_model.num_tensors} tensors, {bench_model.total_bytes} bytes)")
    pts = [(count_buckets(bench_model.tensors, r["bucket_bytes"]), r["seconds"]) for r in curve_run["tune/curve"]]
    pts.append((bench["bench/num_buckets"], bench["bench/colocated_seconds"]))
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    icpt = my - slope * mx
    copy_s = nbytes / (bench["bench/memcpy_gbps"] * GB)
    per_tensor = max(0.0, (icpt - 2 * copy_s) / n)
    per_call = max(0.0, (bench["bench/per_tensor_seconds"] - copy_s) / n)
    text = (f"per bucket = slope of weight-moving seconds vs bucket count over {len(pts)} colocated syncs of the "
            f"{nbytes / 1e6:.0f} MB, {n}-tensor bench model ({len(pts) - 1} bucket sizes from notebook 04, "
            f"{bench['bench/num_buckets']} buckets from labkit bench sync) = {slope * 1e3:.2f} ms; per tensor = "
            f"(intercept {icpt:.3f} s - 2 copies x {copy_s:.4f} s at {bench['bench/memcpy_gbps']:g} GB/s memcpy) / "
            f"{n} = {per_tensor * 1e3:.3f} ms; per-tensor call = ({bench['bench/per_tensor_seconds']:.3f} s - "
            f"{copy_s:.4f} s) / {n} = {per_call * 1e3:.1f} ms")
    return Overheads(per_bucket_s=slope, per_tensor_s=per_tensor, per_call_s=per_call, derivation=text,
                     measured_on="CPU (2 cores, labkit bench sync + notebook 04): CPU-measured overheads, not GPU")


def cpu_overheads(bench_path: str | Path = DATA / "bench_sync_cpu.json",
                  curve_path: str | Path = DATA / "notebook04_bench_cpu.json") -> Overheads:
    """`fit_overheads` over the stored runs in data/."""
    return fit_overheads(json.loads(Path(bench_path).read_text()), json.loads(Path(curve_path).read_text()))
