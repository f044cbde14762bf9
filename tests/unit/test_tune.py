import math
import random

import pytest

from labkit.lab.bench.tune import MB, autotune, candidates, sweep


def _u_curve(opt_mb: float, noise: float, rng: random.Random):
    def measure(size: int) -> dict:
        x = math.log2(size / (opt_mb * MB))
        return {"seconds": 1.0 + 0.08 * x * x + noise * rng.random(), "peak_extra_bytes": 2 * size}
    return measure


@pytest.mark.parametrize("opt_mb", [1, 3, 16, 100, 700])
def test_autotune_reaches_within_10pct_of_sweep_best_in_6_trials(opt_mb):
    rng = random.Random(opt_mb)
    sizes = candidates(1 * MB, 1024 * MB)
    measure = _u_curve(opt_mb, 0.01, rng)
    curve = sweep(measure, sizes, progress=False)
    best = min(c["seconds"] for c in curve)
    r = autotune(measure, sizes, max_trials=6)
    assert len(r["trials"]) <= 6
    assert r["best_seconds"] <= 1.10 * best


def test_candidates_respect_budget_and_reject_bad_ranges():
    sizes = candidates(MB, 64 * MB, budget_bytes=32 * MB)
    assert sizes == [MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB]
    with pytest.raises(ValueError, match="admits no bucket"):
        candidates(64 * MB, 128 * MB, budget_bytes=MB)
    with pytest.raises(ValueError, match="lo_bytes=0"):
        candidates(0, MB)


class _ScriptedSyncs:
    """Stands in for a Workbench's `sync` with scripted metrics: at 1 MiB the session's calls are most of a short
    sync; at 2 MiB the sync is longer. The session is paid on every warm sync, so it is in the tuned time."""

    PHASES = {1.0: {"timing/sync/total": 0.4, "timing/sync/session": 0.3, "timing/sync/setup": 0.05},
              2.0: {"timing/sync/total": 0.5, "timing/sync/session": 0.0, "timing/sync/setup": 0.0}}

    def __init__(self):
        self.cfgs = []

    def sync(self, cfg):
        self.cfgs.append(cfg)
        return {**self.PHASES[cfg.bucket_mb], "timing/sync/verify": 0.0, "sync/peak_extra_bytes": 0}


def test_notebook_04_and_labkit_tune_minimise_the_same_transport_only_time(monkeypatch):
    """Notebook 04 and `labkit tune` tune one quantity, the transport-only time: a warm sync less verification,
    with the per-sync costs a warm sync still pays (setup, session) counted."""
    import contextlib

    from labkit.lab.bench import sync as bench
    from labkit.workbench import notebook

    source = (notebook.NOTEBOOKS / "04_bucket_tuning.py").read_text()
    assert "bench.sync_measure(" in source and "bench.TUNED_KEY" in source  # one function, so one quantity
    wb = _ScriptedSyncs()
    m = bench.sync_measure(wb, "colocated", repeats=2)(MB)
    assert m["metric"] == bench.TUNED_KEY == "timing/sync/transport_only"
    assert m["seconds"] == pytest.approx(0.4)  # the session and setup are in: a warm sync pays them
    assert all(c.verify == "none" and c.atomic is False for c in wb.cfgs)  # the transport, not the guard
    nb_best = autotune(bench.sync_measure(_ScriptedSyncs()), [MB, 2 * MB], max_trials=2)
    monkeypatch.setattr(bench, "_workbench", lambda spec, workdir: contextlib.nullcontext(_ScriptedSyncs()))
    cli = bench.tune(lo_mb=1, hi_mb=2, memory_budget_mb=8, max_trials=2, progress=False)
    assert nb_best["best_bucket_bytes"] == cli["tune/best_bucket_bytes"] == cli["tune/sweep_best_bucket_bytes"] == MB
    assert cli["tune/metric"] == bench.TUNED_KEY


def test_the_bench_rotates_its_transports_and_the_tuned_time_excludes_only_verification():
    from labkit.lab.bench import sync as bench

    assert [bench.rotated(("a", "b", "c"), k) for k in range(4)] == [("a", "b", "c"), ("b", "c", "a"),
                                                                     ("c", "a", "b"), ("a", "b", "c")]
    m = {"timing/sync/total": 1.0, "timing/sync/verify": 0.25, "timing/sync/session": 0.2, "timing/sync/setup": 0.1}
    assert bench.transport_seconds(m) == pytest.approx(0.75)


def test_pick_vs_best_reads_both_from_one_pass():
    from labkit.lab.bench import tune as tn

    curve = [{"bucket_bytes": 1 << k, "seconds": s} for k, s in zip(range(20, 24), (0.4, 0.2, 0.11, 0.1))]
    assert tn.pick_vs_best(curve, 1 << 23) == 1.0
    assert tn.pick_vs_best(curve, 1 << 22) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="bucket_bytes=3 is not on the swept curve"):
        tn.pick_vs_best(curve, 3)


def test_the_bench_summary_compares_labkit_with_the_peer_arms_against_one_bound():
    from labkit.lab.bench.reference import bounds
    from labkit.lab.bench.sync import PEERS
    from labkit.lab.bench.sync_summary import summary

    def sync(total, wall, path="copy_plan"):
        return {"timing/sync/total": total, "timing/sync/verify": 0.0, "timing/sync/wall": wall,
                "timing/sync/session": 0.01, "timing/sync/load": wall / 2, "sync/bytes": 6_000_000_000,
                "sync/num_tensors": 10, "sync/bucket_bytes": 1 << 30, "sync/num_buckets": 6,
                "sync/largest_tensor_bytes": 1 << 20, "sync/peak_extra_bytes": 1 << 31, "sync/apply_path": path}

    times = {"per-tensor": 9.0, "colocated": 1.5, "distributed": 2.5, "direct": 1.0, "peer-colocated": 3.0,
             "peer-distributed": 5.0}
    fast = {t: [sync(s, s), sync(s * 1.2, s * 1.2), sync(s * 0.9, s * 0.9)] for t, s in times.items()}
    full = {t: [sync(s, 2 * s), sync(s, 2 * s), sync(s, 2 * s)] for t, s in times.items()}
    rates = [{"memcpy_gbps": 20.0, "two_copies_gbps": 6.0, "hash_gbps": 10.0}]
    out = summary(fast, full, rates, {"gloo_gbps": 3.0, "samples_s": [1.0]}, bounds, PEERS)
    assert out["bench/colocated_seconds"] == 1.5 and out["bench/colocated_seconds_best"] == pytest.approx(1.35)
    assert out["bench/vs_peer/colocated"] == 2.0 and out["bench/vs_peer/distributed_end_to_end"] == 2.0
    assert out["bench/bound_seconds/peer-colocated"] == out["bench/bound_seconds/colocated"] == 1.0  # one bound
    assert out["bench/of_bound/colocated"] == pytest.approx(1.0 / 1.5, abs=1e-4)
