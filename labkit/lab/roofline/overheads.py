"""Software costs a sync pays on top of moving bytes, for the roofline's predicted time (labkit.lab.roofline.bounds).

The defaults are labkit's own measurements on its 2-core CPU box, fitted from three stored runs: `labkit bench
sync` of the 307-tensor `bench` model (data/bench_sync_cpu.json: per-tensor, colocated and a memcpy, one bucket
size), the same bench of the MoE preset (data/bench_sync_moe_cpu.json: about the same bytes in 4,179 tensors) and
notebook 04's colocated sweep of the bench model over nine bucket sizes (data/notebook04_bench_cpu.json). One run
alone cannot tell a per-bucket cost from a per-tensor one, nor either from a cost every sync pays once; the sweep
sets the first, the MoE/dense pair the second, and what is left of the dense sync the third.
They are CPU-measured and every output says so: on GPUs plug in your own (`Overheads(...)`).

Two fits, one per quantity (`Measure`): transport-only for what-ifs about the transport itself, end to end (the
default sync, verification and the guard included) for a prediction set beside a published sync time, which is
what that system's users waited. `fit_residuals` shows what each fit leaves unexplained, on its own runs and on
runs it never saw. The bench pair may be stored more than once (`stored_pairs`: run 1 in the files above, run k
in `..._cpu_<k>.json`); `cpu_overheads_repeats` fits each pair, so a prediction can carry the range it spans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

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


Measure = Literal["transport_only", "end_to_end"]
"""What a fit explains: `transport_only`, a warm sync without verification or the guard (what labkit's transports
differ by); `end_to_end`, the default sync a user waits for (verification and the guard included): the quantity to
set beside a published sync time."""
MEASURES: tuple[str, ...] = get_args(Measure)


def sync_seconds(run: dict, measure: Measure, transport: str = "colocated") -> float:
    """A `labkit bench sync` run's median seconds of `transport`, as `measure` counts them."""
    key = (f"bench/{transport.replace('-', '_')}_seconds" if measure == "transport_only"
           else f"bench/end_to_end_seconds/{transport}")
    return run[key]


def bytes_seconds(run: dict, measure: Measure) -> float:
    """What a colocated sync's bytes cost at the run's own measured rates: two copies at its memcpy rate, and end
    to end also two hash passes, the trainer's over what it sent and the engine's over what it serves (one pass is
    the run's end-to-end bound less its transport-only one)."""
    copies = 2 * run["bench/model_bytes"] / (run["bench/memcpy_gbps"] * GB)
    if measure == "end_to_end":
        copies += 2 * (run["bench/bound_seconds/colocated_end_to_end"] - run["bench/bound_seconds/colocated"])
    return copies


def predict(over: Overheads, run: dict, measure: Measure, buckets: int | None = None) -> float:
    """A bench run's colocated seconds as the fit explains them (`buckets`: another bucket count of its model)."""
    nb = run["bench/num_buckets"] if buckets is None else buckets
    return (bytes_seconds(run, measure) + over.per_sync_s + nb * over.per_bucket_s
            + run["bench/num_tensors"] * over.per_tensor_s)


def fit_overheads(bench: dict, curve_run: dict, moe: dict, measure: Measure = "transport_only") -> Overheads:
    """Overheads from `labkit bench sync` of the bench model (`bench`) and of the MoE preset (`moe`, same bucket
    size), and notebook 04's colocated sweep of the bench model (`curve_run`). A colocated sync's seconds (as
    `measure` counts them) are taken as its bytes at the run's own rates (`bytes_seconds`) + per sync + buckets x
    per bucket + tensors x per tensor:
    - per bucket: the slope of seconds against the planner's bucket count over the sweep's sizes that hold every
      fused group (below that, oversize groups travel alone in fresh buffers: a cliff, not a per-bucket cost),
      never below 0; the sweep is transport-only, and end to end adds no per-bucket work (verification and the
      guard are per tensor and per sync), so both measures share it;
    - per tensor: what the MoE preset's extra tensors add over the bench model, each run's bytes and buckets taken
      off first (an intercept of the sweep cannot part this from the per-sync cost: the bench model's tensors
      never change);
    - per sync: the bench model's seconds less its bytes, buckets and tensors;
    - per call: the per-tensor transport's seconds less one copy (and end to end the hash passes), per tensor.
    Two runs fix per tensor and per sync exactly, so their residuals are 0 by construction: `fit_residuals` shows
    the sweep's and runs the fit never saw."""
    check(measure in MEASURES, "measure", measure, f"one of {', '.join(MEASURES)}")
    bench_model = model_tensors("bench", "fp32")
    n, nbytes = bench["bench/num_tensors"], bench["bench/model_bytes"]
    check(n == bench_model.num_tensors and nbytes == bench_model.total_bytes, "bench", bench.get("command"),
          f"a run of labkit's bench model ({bench_model.num_tensors} tensors, {bench_model.total_bytes} bytes)")
    check(moe["bench/num_tensors"] > n and moe["bench/bucket_bytes"] == bench["bench/bucket_bytes"], "moe",
          moe.get("command"), f"a run with more than {n} tensors at the bench run's bucket size "
          f"({bench['bench/bucket_bytes']} bytes)")
    slope, npts, nsizes, group = _bucket_slope(bench, curve_run, bench_model)
    per_bucket = max(0.0, slope)

    def left(run: dict) -> float:  # seconds not explained by bytes and buckets
        return sync_seconds(run, measure) - bytes_seconds(run, measure) - per_bucket * run["bench/num_buckets"]

    extra, left_moe, left_bench = moe["bench/num_tensors"] - n, left(moe), left(bench)
    per_tensor = max(0.0, (left_moe - left_bench) / extra)
    per_sync = max(0.0, left_bench - n * per_tensor)
    one = bytes_seconds(bench, measure) - nbytes / (bench["bench/memcpy_gbps"] * GB)  # one copy (+ the hashes)
    per_call = max(0.0, (sync_seconds(bench, measure, "per-tensor") - one) / n)
    text = (f"{measure.replace('_', '-')} seconds; per bucket = slope of weight-moving seconds vs bucket count over "
            f"{npts} colocated syncs of the {nbytes / 1e6:.0f} MB, {n}-tensor bench model ({nsizes} bucket sizes "
            f"of notebook 04 holding its largest group, {group >> 20} MiB; {bench['bench/num_buckets']} buckets "
            f"from labkit bench sync) = {slope * 1e3:.2f} ms{' (taken as 0)' if slope < 0 else ''}; per tensor = "
            f"(MoE preset's {left_moe:.4f} s - bench model's {left_bench:.4f} s left after each run's bytes at its "
            f"own rates and the buckets) / {extra} extra tensors = {per_tensor * 1e6:.1f} us; per sync = "
            f"{left_bench:.4f} s - {n} x per tensor = {per_sync * 1e3:.1f} ms; per-tensor call = "
            f"({sync_seconds(bench, measure, 'per-tensor'):.3f} s - {one:.4f} s) / {n} = {per_call * 1e3:.1f} ms")
    return Overheads(per_bucket_s=per_bucket, per_tensor_s=per_tensor, per_call_s=per_call, per_sync_s=per_sync,
                     derivation=text, measured_on="CPU (2 cores, labkit bench sync of two models + notebook 04, "
                     f"{measure.replace('_', '-')}): CPU-measured overheads, not GPU")


def _bucket_slope(bench: dict, curve_run: dict, bench_model) -> tuple[float, int, int, int]:
    """Least-squares seconds per bucket over the sweep's sizes that hold the largest fused group and the bench
    run (transport-only): (slope, points, sweep sizes used, the group's bytes)."""
    group = largest_group_bytes(bench_model.tensors)
    sweep = [r for r in curve_run["tune/curve"] if r["bucket_bytes"] >= group]
    pts = [(count_buckets(bench_model.tensors, r["bucket_bytes"]), r["seconds"]) for r in sweep]
    pts.append((bench["bench/num_buckets"], bench["bench/colocated_seconds"]))
    check(len({x for x, _ in pts}) > 1, "curve_run", len(sweep), f"two bucket counts at least {group} bytes each")
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return slope, len(pts), len(sweep), group


def fit_residuals(over: Overheads, measure: Measure, fitted: list[tuple[str, dict]],
                  held_out: list[tuple[str, dict]] = (), curve_run: dict | None = None) -> list[dict]:
    """Measured less predicted seconds (`predict`) for the runs the fit used (`fitted`), runs it never saw
    (`held_out`: another model, bytes and tensor count) and, transport-only, each sweep point of `curve_run` that
    holds the largest group (as the bench model at that bucket size, with the first fitted run's rates)."""
    rows = [{"run": name, "role": role, "tensors": r["bench/num_tensors"], "buckets": r["bench/num_buckets"],
             "measured_s": sync_seconds(r, measure), "predicted_s": predict(over, r, measure)}
            for role, runs in (("fitted", fitted), ("held out", held_out)) for name, r in runs]
    if curve_run is not None and measure == "transport_only" and fitted:
        bench_model, base = model_tensors("bench", "fp32"), fitted[0][1]
        check(base["bench/num_tensors"] == bench_model.num_tensors, "fitted", fitted[0][0],
              "the bench model's run first (the sweep's rows are the bench model at other bucket sizes)")
        for r in curve_run["tune/curve"]:
            if r["bucket_bytes"] >= largest_group_bytes(bench_model.tensors):
                nb = count_buckets(bench_model.tensors, r["bucket_bytes"])
                rows.append({"run": f"sweep {r['bucket_bytes'] >> 20} MiB", "role": "fitted (per bucket)",
                             "tensors": base["bench/num_tensors"], "buckets": nb, "measured_s": r["seconds"],
                             "predicted_s": predict(over, base, measure, nb)})
    return [{**row, "residual_s": row["measured_s"] - row["predicted_s"]} for row in rows]


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
                          curve_path: str | Path = DATA / "notebook04_bench_cpu.json",
                          measure: Measure = "transport_only") -> list[Overheads]:
    """`fit_overheads` over each stored bench pair (`stored_pairs`, run 1 first), with the same sweep."""
    curve = json.loads(Path(curve_path).read_text())
    return [fit_overheads(json.loads(d.read_text()), curve, json.loads(m.read_text()), measure)
            for d, m in stored_pairs(data_dir)]


def cpu_overheads(bench_path: str | Path = DATA / "bench_sync_cpu.json",
                  curve_path: str | Path = DATA / "notebook04_bench_cpu.json",
                  moe_path: str | Path = DATA / "bench_sync_moe_cpu.json",
                  measure: Measure = "transport_only") -> Overheads:
    """`fit_overheads` over the stored runs in data/."""
    return fit_overheads(*(json.loads(Path(p).read_text()) for p in (bench_path, curve_path, moe_path)), measure)


GPU_HASH_RUN = "device_check_h100.json"  # labkit bench device on a lent H100: `device/hash_gbps`


def gpu_hash_gbps(data_dir: str | Path = DATA) -> float:
    """The rate of labkit's checksum on a GPU, as measured by the stored device run (its torch-only hash)."""
    run = json.loads((Path(data_dir) / GPU_HASH_RUN).read_text())
    rate = run.get("device/hash_gbps")
    check(isinstance(rate, (int, float)) and rate > 0, GPU_HASH_RUN, rate, "a run with device/hash_gbps > 0")
    return float(rate)


HELD_OUT = ("bench_sync_fp8_bf16_cpu.json",)  # bench runs of other models the fit never sees


def cpu_residuals(measure: Measure, data_dir: str | Path = DATA) -> list[dict]:
    """`fit_residuals` of the stored fit (`cpu_overheads`): its two bench runs, the held-out runs there are, and
    (transport-only) the sweep."""
    data_dir = Path(data_dir)
    load = {f: json.loads((data_dir / f).read_text()) for f in ("bench_sync_cpu.json", "bench_sync_moe_cpu.json",
                                                                  "notebook04_bench_cpu.json")}
    over = fit_overheads(load["bench_sync_cpu.json"], load["notebook04_bench_cpu.json"],
                         load["bench_sync_moe_cpu.json"], measure)
    held = [(f, json.loads((data_dir / f).read_text())) for f in HELD_OUT if (data_dir / f).exists()]
    return fit_residuals(over, measure, [(f, load[f]) for f in ("bench_sync_cpu.json", "bench_sync_moe_cpu.json")],
                         held, load["notebook04_bench_cpu.json"])
