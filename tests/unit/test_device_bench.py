"""`labkit bench device`'s own arithmetic: the refit recovers overheads it was built from and its verdict fails on
any failed check (its GPU run: data/device_check_h100.json; the CPU run: tests/integration/test_bench_cli.py)."""

import pytest

from labkit.lab.device.bench import verdict
from labkit.lab.device.engine import engine_params
from labkit.lab.device.refit import refit, solve


def test_solve_recovers_per_bucket_and_per_tensor_costs():
    pb, pt = 7e-4, 4e-6
    pts = [(b, t, b * pb + t * pt) for b, t in ((38, 399), (30, 4719), (75, 399))]
    got = solve(pts)
    assert got == pytest.approx((pb, pt), rel=1e-9)
    assert solve([(10, 100, -1.0), (20, 300, -2.0)]) == (0.0, 0.0)  # never a negative cost


def test_refit_predicts_the_held_out_size_it_never_saw():
    m = {"device/d2d_gbps": 1000.0}
    for label, buckets, held, tensors in (("a", 38, 75, 399), ("b", 30, 58, 4719)):
        p = f"device/{label}"
        m.update({f"{p}/bytes": 10**10, f"{p}/buckets": buckets, f"{p}/tensors": tensors,
                  f"{p}/heldout/buckets": held,
                  f"{p}/sync_seconds": 0.02 + buckets * 1e-3 + tensors * 2e-6,
                  f"{p}/heldout/sync_seconds": 0.02 + held * 1e-3 + tensors * 2e-6})
    refit(m, ["a", "b"])
    assert m["device/refit/per_bucket_ms"] == pytest.approx(1.0) and m["device/refit/per_tensor_us"] == 2.0
    assert m["device/a/heldout/refit_error"] == 0 and m["device/b/heldout/refit_error"] == 0
    refit(m, ["a", "b"], "serial")
    assert m["device/refit/serial"].startswith("needs")  # no serial syncs stored: said, not invented


def test_verdict_fails_on_any_failed_check_or_stage():
    good = {"device/x/verified": True, "device/x/flip_caught": True, "device/group_ok": True,
            "device/hazard_params_corrupted": {"ack_before_copy": 3, "sync_before_ack": 0}}
    assert verdict(good)
    for bad in ({"device/x/verified": False}, {"device/x/flip_caught": False}, {"device/y/error": "boom"},
                {"device/hazard_params_corrupted": {"ack_before_copy": 3, "sync_before_ack": 1}}):
        assert not verdict({**good, **bad}), bad
    assert verdict({**good, "device/megatron/error": "no wheel"})  # stage 5 is reported apart
    assert not verdict({})  # nothing checked is not a pass


def test_the_stand_in_holds_sglangs_fused_shapes():
    e, i, h = 4, 6, 8
    hf = [(f"model.layers.0.mlp.experts.{x}.{p}_proj.weight", (i, h) if p != "down" else (h, i), "bfloat16")
          for x in range(e) for p in ("gate", "up", "down")]
    hf += [("model.layers.0.self_attn.q_proj.weight", (16, h), "bfloat16"),
           ("model.layers.0.self_attn.k_proj.weight", (4, h), "bfloat16"),
           ("model.layers.0.self_attn.v_proj.weight", (4, h), "bfloat16")]
    got = engine_params(hf)
    assert got["model.layers.0.mlp.experts.w13_weight"][0] == (e, 2 * i, h)
    assert got["model.layers.0.mlp.experts.w2_weight"][0] == (e, h, i)
    assert got["model.layers.0.self_attn.qkv_proj.weight"][:3:2] == ((24, h), [16, 4, 4])
