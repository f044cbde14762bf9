"""Software costs a sync pays on top of moving bytes, for the roofline's predicted time (labkit.lab.roofline.bounds).

The defaults are labkit's own measurements on its 2-core CPU box, fitted from three stored runs: `labkit bench
sync` of the 307-tensor `bench` model (data/bench_sync_cpu.json: per-tensor, colocated and a memcpy, one bucket
size), the same bench of the MoE preset (data/bench_sync_moe_cpu.json: about the same bytes in 4,179 tensors) and
notebook 04's colocated sweep of the bench model over nine bucket sizes (data/notebook04_bench_cpu.json). One run
alone cannot tell a per-bucket cost from a per-tensor one, nor either from a cost every sync pays once; the sweep
sets the first, the MoE/dense pair the second, and what is left of the dense sync the third.
They are CPU-measured and every output says so: on GPUs plug in your own (`Overheads(...)`).

The bench pair is stored several times (`stored_pairs`: run 1 in the files above, run k in `..._cpu_<k>.json`, the
same commands): the memcpy reference and the syncs move from run to run on the 2-core box, and the per-tensor cost,
a difference of two runs, moves most (the three stored pairs fit 7.3, 12.3 and 8.0 us per tensor:
`roofline/overheads_repeats` in data/roofline_published.json). `cpu_overheads_repeats` fits each pair, so every
prediction is given with the range it spans over the runs, not one run's figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.config import check
from labkit.lab.roofline.tensors import count_buckets, largest_group_bytes, model_tensors

GB = 1e9
DATA = Path(__file__).resolve().parents[3] / "data"


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Software costs a sync pays on top of moving bytes; the predicted time is bound + these."""

    per_bucket_s: float
    """One bucket: the engine call, handles, the plan's bookkeeping (serial: one engine's calls in sequence)."""
    per_tensor_s: float
    """One tensor inside a bucketed sync: export, pack slice, copy-plan entry."""
    per_call_s: float
    """One call of the per-tensor transport (one tensor per engine call), for the baseline row."""
    per_sync_s: float = 0.0
    """Once per sync, whatever its size: the session's hand-overs between trainer, worker thread and engine."""
    measured_on: str = "given"
    """Where these were measured; every table that uses them says it."""
    derivation: str = ""
    """The arithmetic behind them."""

    def __post_init__(self) -> None:
        for f in ("per_bucket_s", "per_tensor_s", "per_call_s", "per_sync_s"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, f, v, "seconds >= 0")


def fit_overheads(bench: dict, curve_run: dict, moe: dict) -> Overheads:
    """Overheads from `labkit bench sync` of the bench model (`bench`) and of the MoE preset (`moe`, same bucket
    size), and notebook 04's colocated sweep of the bench model (`curve_run`). A colocated sync's weight-moving
    seconds are taken as two copies of its bytes (pack + apply, at the run's memcpy rate) + per sync + buckets x
    per bucket + tensors x per tensor:
    - per bucket: the slope of seconds against the planner's bucket count over the sweep's sizes that hold every
      fused group (below that, oversize groups travel alone in fresh buffers: a cliff, not a per-bucket cost;
      over all nine sizes of data/notebook04_bench_cpu.json the slope is 2.7 ms per bucket, over the sizes that
      hold the group -0.07 ms), never below 0;
    - per tensor: what the MoE preset's extra tensors (3,872 in data/bench_sync_moe_cpu.json) add over the bench
      model, each run's copies and buckets taken off first (an intercept of the sweep cannot part this from the
      per-sync cost: the bench model's tensors never change);
    - per sync: the bench model's seconds less its copies, buckets and tensors;
    - per call: the per-tensor transport's seconds less one copy, per tensor."""
    bench_model = model_tensors("bench", "fp32")
    n, nbytes = bench["bench/num_tensors"], bench["bench/model_bytes"]
    check(n == bench_model.num_tensors and nbytes == bench_model.total_bytes, "bench", bench.get("command"),
          f"a run of labkit's bench model ({bench_model.num_tensors} tensors, {bench_model.total_bytes} bytes)")
    check(moe["bench/num_tensors"] > n and moe["bench/bucket_bytes"] == bench["bench/bucket_bytes"], "moe",
          moe.get("command"), f"a run with more than {n} tensors at the bench run's bucket size "
          f"({bench['bench/bucket_bytes']} bytes)")
    group = largest_group_bytes(bench_model.tensors)
    sweep = [r for r in curve_run["tune/curve"] if r["bucket_bytes"] >= group]
    pts = [(count_buckets(bench_model.tensors, r["bucket_bytes"]), r["seconds"]) for r in sweep]
    pts.append((bench["bench/num_buckets"], bench["bench/colocated_seconds"]))
    check(len({x for x, _ in pts}) > 1, "curve_run", len(sweep), f"two bucket counts at least {group} bytes each")
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    per_bucket = max(0.0, slope)

    def left(run: dict) -> float:  # seconds not explained by copies and buckets
        copies = 2 * run["bench/model_bytes"] / (run["bench/memcpy_gbps"] * GB)
        return run["bench/colocated_seconds"] - copies - per_bucket * run["bench/num_buckets"]

    extra, left_moe, left_bench = moe["bench/num_tensors"] - n, left(moe), left(bench)
    per_tensor = max(0.0, (left_moe - left_bench) / extra)
    per_sync = max(0.0, left_bench - n * per_tensor)
    copy_s = nbytes / (bench["bench/memcpy_gbps"] * GB)
    per_call = max(0.0, (bench["bench/per_tensor_seconds"] - copy_s) / n)
    text = (f"per bucket = slope of weight-moving seconds vs bucket count over {len(pts)} colocated syncs of the "
            f"{nbytes / 1e6:.0f} MB, {n}-tensor bench model ({len(sweep)} bucket sizes of notebook 04 holding its "
            f"largest group, {group >> 20} MiB; {bench['bench/num_buckets']} buckets from labkit bench sync) = "
            f"{slope * 1e3:.2f} ms{' (taken as 0)' if slope < 0 else ''}; per tensor = (MoE preset's "
            f"{left_moe:.4f} s - bench model's {left_bench:.4f} s left after two copies at each run's memcpy "
            f"rate and the buckets) / {extra} extra tensors = {per_tensor * 1e6:.1f} us; per sync = "
            f"{left_bench:.4f} s - {n} x per tensor = {per_sync * 1e3:.1f} ms; per-tensor call = "
            f"({bench['bench/per_tensor_seconds']:.3f} s - {copy_s:.4f} s) / {n} = {per_call * 1e3:.1f} ms")
    return Overheads(per_bucket_s=per_bucket, per_tensor_s=per_tensor, per_call_s=per_call, per_sync_s=per_sync,
                     derivation=text, measured_on="CPU (2 cores, labkit bench sync of two models + notebook 04): "
                     "CPU-measured overheads, not GPU")


def stored_pairs(data_dir: str | Path = DATA) -> list[tuple[Path, Path]]:
    """(bench model, MoE preset) files of each stored run of the bench pair: run 1 `bench_sync_cpu.json` with
    `bench_sync_moe_cpu.json`, run k `bench_sync_cpu_<k>.json` with `bench_sync_moe_cpu_<k>.json` (k < 10). A run
    with one half missing is refused, naming the file: a dense run fitted against another run's MoE half would
    mix two boxes' states."""
    data_dir = Path(data_dir)
    names = ["bench_sync_cpu.json", *sorted(p.name for p in data_dir.glob("bench_sync_cpu_[0-9].json"))]
    pairs = []
    for name in names:
        dense, moe = data_dir / name, data_dir / name.replace("bench_sync_cpu", "bench_sync_moe_cpu")
        missing = [p for p in (dense, moe) if not p.exists()]
        gone = ", ".join(p.name for p in missing)
        check(not missing, "data_dir", str(data_dir), f"both halves of each bench pair ({gone} missing)")
        pairs.append((dense, moe))
    return pairs


def cpu_overheads_repeats(data_dir: str | Path = DATA,
                          curve_path: str | Path = DATA / "notebook04_bench_cpu.json") -> list[Overheads]:
    """`fit_overheads` over each stored bench pair (`stored_pairs`, run 1 first), with the same sweep."""
    curve = json.loads(Path(curve_path).read_text())
    return [fit_overheads(json.loads(d.read_text()), curve, json.loads(m.read_text()))
            for d, m in stored_pairs(data_dir)]


def cpu_overheads(bench_path: str | Path = DATA / "bench_sync_cpu.json",
                  curve_path: str | Path = DATA / "notebook04_bench_cpu.json",
                  moe_path: str | Path = DATA / "bench_sync_moe_cpu.json") -> Overheads:
    """`fit_overheads` over the stored runs in data/."""
    return fit_overheads(*(json.loads(Path(p).read_text()) for p in (bench_path, curve_path, moe_path)))
