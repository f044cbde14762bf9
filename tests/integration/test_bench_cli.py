"""`labkit bench sync` and `labkit tune`: real runs on a small model; the JSON contract is what is checked
(the speed targets live in the benchmark's own output, never in assertions)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

BENCH_KEYS = ["bench/speedup_bucketed_vs_per_tensor", "bench/colocated_gbps", "bench/distributed_gbps",
              "bench/memcpy_gbps", "bench/colocated_vs_memcpy", "bench/distributed_vs_memcpy",
              "bench/peak_extra_bytes", "bench/bucket_bytes", "bench/largest_tensor_bytes", "bench/model_bytes"]
TUNE_KEYS = ["tune/best_bucket_bytes", "tune/best_seconds", "tune/trials", "tune/sweep_best_bucket_bytes",
             "tune/sweep_best_seconds", "tune/curve", "tune/metric"]


def _labkit(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout.strip().splitlines(), p.stderr


CLIS = {"bench": ("bench", "sync", "--quick", "--reps", "1", "--bucket-mb", "4", "--json"),
        "tune": ("tune", "--quick", "--lo-mb", "0.5", "--hi-mb", "8", "--memory-budget-mb", "16", "--max-trials", "3",
                 "--json")}


@pytest.fixture(scope="module")
def clis() -> dict:
    """`labkit bench sync` and `labkit tune`, run at the same time (each starts its own Ray, trainer and engine, a
    minute of mostly waiting on 2 cores; their timings are not asserted): {name: (rc, stdout lines, stderr)}."""
    procs = {k: subprocess.Popen([sys.executable, "-m", "labkit.cli", *a], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, a in CLIS.items()}
    out = {}
    for k, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out[k] = (p.returncode, stdout.strip().splitlines(), stderr)
    return out


def test_bench_sync_cli_prints_the_metric_keys(clis):
    rc, out, err = clis["bench"]
    assert rc == 0, err[-3000:]
    m = json.loads(out[-1])
    for k in BENCH_KEYS:
        assert k in m, k
    assert m["bench/verified"] is True and m["bench/engine_tensors_changed"] > 0  # trained between syncs
    assert m["bench/transport_only_verified"] is True  # every timed sync checked against the export after it
    for t in ("per-tensor", "colocated", "distributed", "direct"):  # this box's bound, measured in the same run
        assert 0 < m[f"bench/bound_seconds/{t}"] < m[f"bench/bound_seconds/{t}_end_to_end"]
        assert 0 < m[f"bench/of_bound/{t}"] and 0 < m[f"bench/of_bound/{t}_end_to_end"]
    assert m["bench/memcpy_gbps"] == max(m["bench/memcpy_gbps_samples"]) and m["bench/gloo_gbps"] > 0
    for t in ("colocated", "distributed"):  # the field's own method, in the same run (SGLang's stock loader)
        assert m[f"bench/vs_peer/{t}"] > 0 and m[f"bench/vs_peer/{t}_end_to_end"] > 0
        assert m[f"bench/apply_path/peer-{t}"] == "load_weights" and m[f"bench/apply_path/{t}"] == "copy_plan"
    for t in ("per-tensor", "colocated", "distributed"):  # end to end beside transport-only, equal repetitions
        assert m[f"bench/end_to_end_seconds/{t}"] > 0 and len(m[f"bench/end_to_end_seconds_all/{t}"]) == 1
    assert m["bench/speedup_end_to_end"] > 0 and m["bench/apply_path"] == "copy_plan"
    assert m["bench/model_bytes"] > 10 * m["bench/largest_tensor_bytes"] > 0
    assert m["bench/speedup_bucketed_vs_per_tensor"] > 1.0  # measured, not asserted against the 20x target
    assert m["bench/peak_extra_bytes"] <= 2 * m["bench/bucket_bytes"] + 2 * m["bench/largest_tensor_bytes"]


def test_tune_cli_sweeps_under_budget_and_autotunes(clis):
    rc, out, err = clis["tune"]
    assert rc == 0, err[-3000:]
    m = json.loads(out[-1])
    for k in TUNE_KEYS:
        assert k in m, k
    sizes = [c["bucket_bytes"] for c in m["tune/curve"]]
    assert sizes == sorted(sizes) and max(sizes) * 2 <= 16 << 20 and len(sizes) == 5
    assert m["tune/trials"] <= 3 and m["tune/best_bucket_bytes"] in sizes
    assert m["tune/metric"] == "timing/sync/transport_only"  # the quantity notebook 04 tunes too


@pytest.mark.parametrize("args,match", [
    (["sync", "--bucket-mb", "0"], "bucket_mb='0'"), (["sync", "--bucket-mb", "abc"], "bucket_mb='abc'"),
    (["sync", "--bucket-mb", "-1"], "bucket_mb='-1'"), (["sync", "--transport", "pigeon"], "transport='pigeon'"),
    (["sync", "--bucket-mb", "64", "--memory-budget-mb", "100"], "bucket_mb=64"),
    (["soak", "--minutes", "0"], "minutes='0'"), (["soak", "--pause-mode", "in_place"], "in_place"),
])
def test_bad_cli_flags_fail_before_anything_starts(args, match):
    rc, out, err = _labkit(*args, timeout=60)
    assert rc != 0 and match in err, err[-2000:]


DEVICE_KEYS = ["device/name", "device/d2d_gbps", "device/nccl_ok", "device/hazard_params_corrupted",
               "device/group_ok", "device/hash_host_equals_device"]
DEVICE_MODEL_KEYS = ["pack_gbps", "apply_gbps", "sync_seconds", "vs_d2d", "ipc_opened_once", "verified",
                     "flip_caught", "delta_verified"]


def test_bench_device_runs_its_stages_on_cpu_and_stores_them(tmp_path):
    """The GPU device check in its small size on CPU (what CI can run, so the command cannot rot): every stage,
    its own checks passing, the run stored with its command and commit."""
    out = tmp_path / "device.json"
    rc, lines, err = _labkit("bench", "device", "--json", "--megatron", "off", "--warm", "1", "--out", str(out))
    assert rc == 0, err[-3000:]
    m = json.loads(lines[-1])
    for k in DEVICE_KEYS:
        assert k in m, k
    for model in ("qwen3-8b", "qwen3-30b-a3b-12l"):
        for k in DEVICE_MODEL_KEYS:
            assert f"device/{model}/{k}" in m, (model, k)
        assert m[f"device/{model}/verified"] is True and m[f"device/{model}/flip_caught"] is True
        assert m[f"device/{model}/apply_path"][1] == 0  # every tensor by the copy plan
    assert m["device/verified"] is True and m["device/size"] == "small" and "stand-in" in m["device/engine"]
    stored = json.loads(out.read_text())
    assert stored["command"].startswith("labkit bench device") and stored["device/commit"]
    assert stored["commit"] == stored["device/commit"] and stored["versions"]["torch"] and stored["host"]
