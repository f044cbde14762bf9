"""The sync roofline (labkit.lab.roofline): tensor lists from config.json alone, transport bounds checked against
hand arithmetic, overheads fitted from the stored CPU runs, published rows with their sources, and bad input
refused with the value and what is allowed."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from labkit.models import tiny
from labkit.models.hf import checkpoint_tensors
from labkit.lab.roofline import bounds as rf
from labkit.lab.roofline import published as rp
from labkit.sync.plan import plan_buckets
from labkit.lab.roofline.tensors import model_tensors
from labkit.lab.roofline.overheads import stored_pairs

DATA = rf.ROOT / "data"


# ---------------------------------------------------------------------------------------------- tensor lists
@pytest.mark.parametrize("name, published, mtp", [
    ("moonlight-16b-a3b", 16.0e9, True),     # "Moonlight-16B-A3B": 16 B total
    ("qwen3-30b-a3b", 30.5e9, True),         # model card: 30.5 B
    ("deepseek-v3", 671e9, False),           # 671 B main model ...
    ("deepseek-v3", 685e9, True),            # ... 685 B with its MTP module
    ("kimi-k2", 1.03e12, True),              # 1.03 T
])
def test_parameter_totals_match_the_published_sizes(name, published, mtp):
    assert model_tensors(name, "bf16", mtp=mtp).params == pytest.approx(published, rel=0.02)


def test_expert_tensor_counts_by_hand():
    # MoE layers x routed experts x (gate, up, down); DeepSeek-V3's MTP layer is one more MoE layer.
    assert model_tensors("moonlight-16b-a3b").expert_tensors == (27 - 1) * 64 * 3 == 4992
    assert model_tensors("qwen3-30b-a3b").expert_tensors == 48 * 128 * 3 == 18432  # verl #6974's "~18k"
    assert model_tensors("deepseek-v3", mtp=False).expert_tensors == (61 - 3) * 256 * 3
    assert model_tensors("deepseek-v3").expert_tensors == (61 - 3 + 1) * 256 * 3
    assert model_tensors("kimi-k2").expert_tensors == (61 - 1) * 384 * 3


def _qwen3_30b_params() -> int:
    h, v, layers, hd, experts, moe = 2048, 151936, 48, 128, 128, 768
    attn = h * 32 * hd + 2 * h * 4 * hd + 32 * hd * h + 2 * hd  # q, k, v, o, q_norm, k_norm
    layer = attn + 2 * h + experts * h + experts * 3 * h * moe  # two norms, router, experts
    return 2 * v * h + layers * layer + h  # untied embedding and head, final norm


def _moonlight_params() -> int:
    h, v, heads, kvl = 2048, 163840, 16, 512
    attn = h * heads * 192 + h * (kvl + 64) + kvl + kvl * heads * 256 + heads * 128 * h  # no q LoRA
    dense = attn + 2 * h + 3 * h * 11264
    moe = attn + 2 * h + 64 * h + 64 + 64 * 3 * h * 1408 + 3 * h * 2 * 1408  # router, bias, experts, 2 shared
    return 2 * v * h + dense + 26 * moe + h


def test_enumerator_matches_hand_counted_parameters():
    assert model_tensors("qwen3-30b-a3b").params == _qwen3_30b_params()
    assert model_tensors("moonlight-16b-a3b").params == _moonlight_params()


def test_labkit_mimo_names_shapes_and_order_are_the_checkpoints():
    bench = model_tensors("bench", "fp32")
    assert [(t.name, t.shape) for t in bench.tensors] == list(tiny.tensor_shapes(tiny.BENCH_SPEC).items())
    run = json.loads((DATA / "bench_sync_cpu.json").read_text())
    assert (bench.num_tensors, bench.total_bytes) == (run["bench/num_tensors"], run["bench/model_bytes"])
    shipped = model_tensors(str(tiny.DEFAULT_DIR), "fp32")  # a model directory: its config.json
    assert {t.name: (t.shape, t.dtype) for t in shipped.tensors} == checkpoint_tensors(tiny.DEFAULT_DIR)
    assert model_tensors("tiny", mtp=False).num_tensors == 43 - 16  # the MTP layer's 16 tensors left out


@pytest.mark.parametrize("arch, extra, per_layer", [
    ("llama", {}, 4 * 64 * 64 + 3 * 64 * 96 + 2 * 64),
    ("qwen2", {}, 4 * 64 * 64 + 3 * 64 + 3 * 64 * 96 + 2 * 64),            # q/k/v biases
    ("qwen3", {"head_dim": 32}, 4 * 64 * 64 + 2 * 32 + 3 * 64 * 96 + 2 * 64),  # q/k norms
])
def test_dense_families_by_hand(arch, extra, per_layer):
    cfg = {"model_type": arch, "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
           "num_attention_heads": 2, "num_key_value_heads": 2, "tie_word_embeddings": True, **extra}
    assert model_tensors(cfg).params == 100 * 64 + 3 * per_layer + 64  # tied: no lm_head
    assert "lm_head.weight" not in {t.name for t in model_tensors(cfg).tensors}


def test_fp8_is_deepseeks_block_format():
    t = {m.name: m for m in model_tensors("deepseek-v3", "fp8").tensors}
    q = "model.layers.0.self_attn.q_b_proj.weight"
    assert (t[q].dtype, t[q].shape) == ("float8_e4m3fn", (128 * 192, 1536))
    assert (t[q + "_scale_inv"].dtype, t[q + "_scale_inv"].shape) == ("float32", (192, 12))
    assert t["model.embed_tokens.weight"].dtype == t["model.layers.3.mlp.gate.weight"].dtype == "bfloat16"
    assert t["model.layers.61.eh_proj.weight"].dtype == "bfloat16"  # the MTP layer's projection is not FP8
    assert model_tensors("kimi-k2", "fp8").total_bytes == pytest.approx(1.03e12, rel=0.01)


def test_bucket_count_is_the_planners():
    for name, weights in (("bench", "fp32"), ("moonlight-16b-a3b", "bf16"), ("quick", "fp8")):
        ts = list(model_tensors(name, weights).tensors)
        for mb in (0.25, 1, 3, 32, 512):
            assert rf.count_buckets(ts, int(mb * rf.MB)) == len(plan_buckets(ts, int(mb * rf.MB)).buckets)
    run = json.loads((DATA / "bench_sync_cpu.json").read_text())
    bench = model_tensors("bench", "fp32").tensors
    assert rf.count_buckets(bench, run["bench/bucket_bytes"]) == run["bench/num_buckets"]


# ---------------------------------------------------------------------------------------------- bounds
def test_bounds_reproduce_hand_computation():
    qwen = 2 * _qwen3_30b_params()  # bf16 bytes
    assert model_tensors("qwen3-30b-a3b").total_bytes == qwen
    h100, h20 = rf.hardware("H100"), rf.hardware("H20")
    assert rf.bound("nvlink-broadcast", qwen, h100).seconds == pytest.approx(qwen / 450e9)  # ~0.136 s
    assert rf.bound("rdma-broadcast", qwen, h100).seconds == pytest.approx(qwen / 50e9)  # one NIC: ~1.22 s
    assert rf.bound("colocated", qwen, h100).seconds == pytest.approx(2 * qwen / 8 / 3350e9)  # 1/8 per GPU
    full = rf.Layout(colocated_copy="full")
    assert rf.bound("colocated", qwen, h100, full).seconds == pytest.approx(2 * qwen / 3350e9)
    moon = 2 * _moonlight_params()
    assert rf.bound("colocated", moon, h20).seconds == pytest.approx(2 * moon / 8 / 4000e9)  # ~2 ms
    p2p = rf.Layout(trainer_gpus=256, engine_gpus=128, engine_tp=16)  # 8 replicas, 8 copies
    assert rf.bound("rdma-p2p", 1e12, h100, p2p).seconds == pytest.approx(8e12 / (128 * 50e9))
    wide = rf.Layout(broadcast_nics=16)  # more NICs than the node has: its 8, then NVLink caps it
    assert rf.bound("rdma-broadcast", 1e12, h100, wide).seconds == pytest.approx(1e12 / 400e9)


def test_overheads_fitted_from_the_stored_cpu_runs():
    over = rf.cpu_overheads()
    run = json.loads((DATA / "bench_sync_cpu.json").read_text())
    copy_s = run["bench/model_bytes"] / (run["bench/memcpy_gbps"] * 1e9)
    assert over.per_call_s == pytest.approx((run["bench/per_tensor_seconds"] - copy_s) / run["bench/num_tensors"])
    # per bucket: none seen, a sync is one engine call (labkit.engine.inside.ring)
    assert 0 <= over.per_bucket_s < 0.02 and 0 < over.per_tensor_s < 1e-4 and 0 < over.per_sync_s < 0.1
    assert "CPU-measured" in over.measured_on and "notebook 04" in over.derivation


def test_every_stored_bench_pair_is_fitted_and_a_missing_half_is_refused(tmp_path):
    pairs = stored_pairs()
    assert pairs[0] == (DATA / "bench_sync_cpu.json", DATA / "bench_sync_moe_cpu.json")
    assert [p.name for _, p in pairs[1:]] == [f"bench_sync_moe_cpu_{k}.json" for k in range(2, len(pairs) + 1)]
    fits = rf.cpu_overheads_repeats()
    assert len(fits) == len(pairs) and fits[0] == rf.cpu_overheads()  # run 1 is the headline fit
    for name in ("bench_sync_cpu.json", "bench_sync_moe_cpu.json", "bench_sync_cpu_2.json", "bench_sync_cpu_at_x.json"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(ValueError, match="bench_sync_moe_cpu_2.json missing"):
        stored_pairs(tmp_path)
    (tmp_path / "bench_sync_moe_cpu_2.json").write_text("{}")  # the `_at_<commit>` runs are not repeats
    assert [d.name for d, _ in stored_pairs(tmp_path)] == ["bench_sync_cpu.json", "bench_sync_cpu_2.json"]


def test_the_fit_recovers_known_costs_and_skips_sizes_below_the_largest_group():
    """Runs made from known costs (and a cliff below the largest fused group, where oversize groups travel in
    fresh buffers) give those costs back; fitting across the cliff would not."""
    from labkit.lab.roofline.tensors import count_buckets, largest_group_bytes, model_tensors

    bench = model_tensors("bench", "fp32")
    per_sync, per_bucket, per_tensor, gbps = 0.02, 0.001, 6e-6, 10.0
    group = largest_group_bytes(bench.tensors)

    def seconds(nbytes, buckets, tensors):
        return 2 * nbytes / (gbps * 1e9) + per_sync + buckets * per_bucket + tensors * per_tensor

    def run(tensors, nbytes, buckets):
        hash_s = nbytes / (hash_gbps * 1e9)  # one hash pass; end to end hashes on both sides and pays e2e costs
        return {"bench/num_tensors": tensors, "bench/model_bytes": nbytes, "bench/num_buckets": buckets,
                "bench/bucket_bytes": 32 << 20, "bench/memcpy_gbps": gbps, "bench/per_tensor_seconds": 3.0,
                "bench/colocated_seconds": seconds(nbytes, buckets, tensors),
                "bench/bound_seconds/colocated": 0.01, "bench/bound_seconds/colocated_end_to_end": 0.01 + hash_s,
                "bench/end_to_end_seconds/colocated": seconds(nbytes, buckets, tensors) + 2 * hash_s + e2e_sync
                + tensors * e2e_tensor, "bench/end_to_end_seconds/per-tensor": 4.0}

    hash_gbps, e2e_sync, e2e_tensor = 5.0, 0.05, 3e-6

    n, nbytes = bench.num_tensors, bench.total_bytes
    dense, moe = run(n, nbytes, count_buckets(bench.tensors, 32 << 20)), run(4179, 300_000_000, 9)
    curve = [{"bucket_bytes": mb << 20, "seconds": seconds(nbytes, count_buckets(bench.tensors, mb << 20), n)
              + (0.2 if mb << 20 < group else 0.0)} for mb in (1, 2, 4, 8, 16, 64, 256)]
    over = rf.fit_overheads(dense, {"tune/curve": curve}, moe)
    assert over.per_bucket_s == pytest.approx(per_bucket)
    assert over.per_tensor_s == pytest.approx(per_tensor)
    assert over.per_sync_s == pytest.approx(per_sync)
    e2e = rf.fit_overheads(dense, {"tune/curve": curve}, moe, "end_to_end")  # like with like: end-to-end seconds
    assert e2e.per_bucket_s == pytest.approx(per_bucket)
    assert e2e.per_tensor_s == pytest.approx(per_tensor + e2e_tensor)
    assert e2e.per_sync_s == pytest.approx(per_sync + e2e_sync)
    one_copy_and_hashes = nbytes / (gbps * 1e9) + 2 * nbytes / (hash_gbps * 1e9)
    assert e2e.per_call_s == pytest.approx((4.0 - one_copy_and_hashes) / n)
    held = run(45, 1_250_000, 1)  # another model, made from the same costs: the fit predicts it exactly
    res = rf.fit_residuals(e2e, "end_to_end", [("dense", dense), ("moe", moe)], [("held", held)],
                           {"tune/curve": curve})
    assert [r["role"] for r in res] == ["fitted", "fitted", "held out"]  # the sweep is transport-only
    assert all(r["residual_s"] == pytest.approx(0, abs=1e-12) for r in res)
    held["bench/end_to_end_seconds/colocated"] += 0.02  # a run the costs do not explain shows by how much
    assert rf.fit_residuals(e2e, "end_to_end", [], [("held", held)])[0]["residual_s"] == pytest.approx(0.02)
    res = rf.fit_residuals(over, "transport_only", [("dense", dense)], [], {"tune/curve": curve})
    sweep = [r for r in res if r["run"].startswith("sweep")]
    assert [r["run"] for r in sweep] == [f"sweep {mb} MiB" for mb in (1, 2, 4, 8, 16, 64, 256) if mb << 20 >= group]
    assert all(r["residual_s"] == pytest.approx(0, abs=1e-12) for r in res)
    with pytest.raises(ValueError, match="moe"):
        rf.fit_overheads(dense, {"tune/curve": curve}, dense)  # no extra tensors: nothing to fit per tensor from
    with pytest.raises(ValueError, match="measure='wall'"):
        rf.fit_overheads(dense, {"tune/curve": curve}, moe, "wall")


def test_predicted_is_bound_plus_overheads():
    over = rf.Overheads(per_bucket_s=0.02, per_tensor_s=1e-4, per_call_s=0.01)
    s = rf.Scenario(model="moonlight-16b-a3b", bucket_mb=512)
    rows = {r["transport"]: r for r in rf.transport_rows(s, over)}
    n, b = 5317, rows["colocated"]["buckets"]
    assert rows["colocated"]["predicted_s"] == pytest.approx(rows["colocated"]["bound_s"] + b * 0.02 + n * 1e-4)
    with_sync = rf.Overheads(per_bucket_s=0.02, per_tensor_s=1e-4, per_call_s=0.01, per_sync_s=0.5)
    row = rf.transport_rows(s, with_sync)[0]
    assert row["predicted_s"] == pytest.approx(rows[row["transport"]]["predicted_s"] + 0.5)
    assert rows["per-tensor calls (colocated)"]["overhead_s"] == pytest.approx(n * 0.01)
    curve = rf.whatif(s, over, [rf.MB, 64 * rf.MB, 4096 * rf.MB])
    assert [p["buckets"] for p in curve] == sorted((p["buckets"] for p in curve), reverse=True)


# ---------------------------------------------------------------------------------------------- published
def test_published_rows_carry_sources_and_their_fraction():
    rows = {r["system"]: r for r in rp.published_rows()}
    assert len(rows) == 5 and all(r["source"] and r["assumption"] for r in rows.values())
    assert "PR #2418" in rows["verl PR #2418"]["source"] and "README" in rows["checkpoint-engine"]["source"]
    assert "perplexity" in rows["Perplexity"]["source"] and "prime-rl" in rows["prime-rl"]["source"]
    verl = rows["verl PR #2418"]
    assert verl["fraction_of_limit"] == pytest.approx(2 * verl["bytes"] / 8 / 4000e9 / 18.0)
    assert rows["prime-rl"]["fraction_of_limit"] == pytest.approx(44.3 / 50)
    ppl = rows["Perplexity"]
    assert ppl["fraction_of_limit"] == pytest.approx(ppl["bytes"] / (128 * 50e9) / 1.3)
    ce = rows["checkpoint-engine"]  # the row's assumption: one NIC per node could not have made 16.04 s
    assert ce["bytes"] / 50e9 > 16.04 > ce["bound_s"] == pytest.approx(ce["bytes"] / 400e9)
    assert not any("predicted_s" in r for r in rows.values())  # no overheads given, no prediction
    over = rf.Overheads(per_bucket_s=0.01, per_tensor_s=1e-5, per_call_s=0.0, per_sync_s=0.2)
    assert not any("predicted_s" in r for r in rp.published_rows(over))  # no hash rate: no end-to-end prediction
    rows = {r["system"]: r for r in rp.published_rows(over, hash_gbps=50.0)}
    slime = rows["slime (blog)"]  # a colocated row with its bucket size published: bound + hashing + the overheads
    assert slime["buckets"] == model_tensors("qwen3-30b-a3b", "bf16", mtp=False).buckets(512 << 20)
    per_gpu = slime["bytes"] / 8  # engine TP=8: each GPU copies and hashes its shard
    assert slime["hash_s"] == pytest.approx(2 * per_gpu / 50e9)
    assert slime["predicted_s"] == pytest.approx(slime["bound_s"] + slime["hash_s"] + 0.2 + slime["buckets"] * 0.01
                                                 + slime["tensors"] * 1e-5)
    assert "predicted_s" in rows["verl PR #2418"] and "predicted_s" not in rows["Perplexity"]
    with pytest.raises(ValueError, match="bucket_mb=512 is invalid: expected None, or a positive number of MiB on "
                                         "a colocated row"):
        dataclasses.replace(rp.PUBLISHED[2], bucket_mb=512)  # checkpoint-engine: a broadcast, not colocated


def test_stored_run_is_current():
    from labkit.lab.roofline import notebook as roofline_nb

    stored = json.loads((DATA / "roofline_published.json").read_text())
    assert stored.pop("command") == "labkit roofline --json --out data/roofline_published.json"
    stored.pop("provenance", None)  # what made the run (labkit.provenance), not what it computed
    assert stored == json.loads(json.dumps(roofline_nb.run(), default=str)), "rerun the command in 'command'"


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make, message", [
    (lambda: model_tensors({"model_type": "gpt_neox"}),
     "model_type='gpt_neox' in config is not supported by the roofline: expected one of deepseek_v3, qwen3_moe"),
    (lambda: rf.Scenario(model="llama-9000"), "model='llama-9000' is invalid: expected one of moonlight-16b-a3b"),
    (lambda: rf.hardware("B200"), "hardware='B200' is invalid: expected one of H100, H200, H20"),
    (lambda: rf.Scenario(hardware="B200"), "hardware='B200' is invalid: expected one of H100, H200, H20"),
    (lambda: rf.Scenario(bucket_mb=0), "bucket_mb=0 is invalid: expected a positive number of MiB"),
    (lambda: rf.Scenario(bucket_mb=-1.5), "bucket_mb=-1.5 is invalid: expected a positive number of MiB"),
    (lambda: rf.count_buckets([], 0), "bucket_bytes=0 is invalid: expected a positive integer number of bytes"),
    (lambda: rf.Scenario(weights="int4"), "weights='int4' is invalid: expected one of bf16, fp8, fp32"),
    (lambda: rf.bound("pigeon", 1e9, rf.hardware("H100")), "transport='pigeon' is invalid: expected one of colocated"),
    (lambda: rf.Layout(engine_gpus=8, engine_tp=3), "engine_tp=3 is invalid: expected a divisor of engine_gpus=8"),
    (lambda: rf.Overheads(per_bucket_s=-1, per_tensor_s=0, per_call_s=0), "per_bucket_s=-1 is invalid"),
])
def test_bad_input_names_the_value_and_what_is_allowed(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value).startswith(message), str(e.value)


def test_cli_json_and_bad_flags(capsys):
    from labkit.cli import main

    assert main(["roofline", "--model", "kimi-k2", "--weights", "fp8", "--hardware", "H20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["roofline/scenario"]["model"] == "kimi-k2" and len(out["roofline/transports"]) == 5
    with pytest.raises(SystemExit) as e:
        main(["roofline", "--bucket-mb", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "bucket_mb='0' is invalid: expected a positive number of MiB" in err
    with pytest.raises(SystemExit):
        main(["roofline", "--model", "no-such-model"])
    assert "model='no-such-model' is invalid: expected one of moonlight-16b-a3b" in capsys.readouterr().err
    assert main(["roofline", "--engine-gpus", "12"]) == 2  # a rule across two fields: the constructor names it
    assert "engine_tp=8 is invalid: expected a divisor of engine_gpus=12" in capsys.readouterr().err


def test_notebook_helpers_build_table_and_figure(monkeypatch):
    from labkit.workbench import nb
    from labkit.lab.roofline import notebook as roofline_nb

    monkeypatch.setattr(nb, "_METRICS", {})
    monkeypatch.delenv("LABKIT_METRICS", raising=False)
    s, over = rf.Scenario(model="moonlight-16b-a3b"), rf.cpu_overheads()
    rows = roofline_nb.transport_table(s, over)
    assert [r["transport"] for r in rows] == [*rf.LINKS, "per-tensor calls (colocated)"]
    fig = roofline_nb.whatif_figure(s, over, 4, 64)
    assert len(fig.data) == 2 * len(rf.LINKS) + 2 and nb.metrics()["roofline/model"] == "Moonlight-16B-A3B"
    want = rf.bound("colocated", model_tensors("moonlight-16b-a3b").total_bytes, rf.hardware("H100")).seconds
    assert math.isclose(nb.metrics()["roofline/bound_s/colocated"], want)


def test_roofline_is_pure():
    code = ("import sys, labkit.lab.roofline.bounds, labkit.lab.roofline.published, labkit.lab.roofline.tensors; "
            "print(sorted(m for m in ('torch', 'ray', 'sglang', 'megatron', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_explorer_redraws_on_run_only():
    from labkit.lab.roofline import notebook as roofline_nb

    box = roofline_nb.explorer(rf.Scenario(), rf.cpu_overheads(), 4, 64)
    (model, _, hw), (bucket, button), out = box.children[0].children, box.children[1].children, box.children[2]
    model.value, hw.value, bucket.value = "moonlight-16b-a3b", "H20", 16.0
    assert out.outputs == ()  # moving a control computes nothing
    button.click()
    table, fig = (o["data"] for o in out.outputs)
    assert "<td>colocated</td>" in table["text/html"] and "Moonlight-16B-A3B" in json.dumps(fig)
