"""`labkit demo` exits non-zero and names the check when one fails (issue 16: it exited 0 on a greedy mismatch).

The decision is pure (metrics -> exit code, failed checks), tested here without running the demo."""

import math

import pytest

from labkit.workbench import demo

GOOD = {"export/logits_max_abs_diff": 3e-6, "export/mtp_logits_max_abs_diff": 2e-5, "per_tensor/sync/verified": True,
        "sync/verified": True, "rollout/greedy_match": True, "rollout/greedy_match_frac": 1.0, "demo/dtype": "float32",
        "eval/loss_before": 0.137, "eval/loss_after": 0.122}


def test_a_demo_whose_checks_all_pass_exits_0():
    assert demo.verdict(GOOD) == (0, [])


@pytest.mark.parametrize("change,check", [
    ({"rollout/greedy_match": False, "rollout/greedy_match_frac": 0.75}, "greedy match"),
    ({"sync/verified": False}, "bucketed sync verified"),
    ({"sync/verified": None}, "bucketed sync verified"),  # verification skipped is not verified
    ({"per_tensor/sync/verified": False}, "per-tensor sync verified"),
    ({"export/logits_max_abs_diff": 0.05}, "export parity"),
    ({"export/mtp_logits_max_abs_diff": math.nan}, "export parity"),
    ({"eval/loss_after": 0.419}, "training lowers the loss"),  # issue 17: lr=1e-3 raised it 0.137 -> 0.419
    ({"eval/loss_after": 0.137}, "training lowers the loss"),
    ({"eval/loss_after": math.nan}, "training lowers the loss"),
])
def test_a_failed_check_exits_nonzero_and_is_named(change, check):
    code, failed = demo.verdict({**GOOD, **change})
    assert code != 0 and len(failed) == 1 and failed[0].startswith(f"{check}: "), failed
    key, value = next(iter(change.items()))
    assert f"{key}={value!r}" in failed[0]


def test_a_check_without_its_metric_fails():
    m = dict(GOOD)
    del m["rollout/greedy_match"]
    code, failed = demo.verdict(m)
    assert code == 1 and failed == ["greedy match: rollout/greedy_match='missing', rollout/greedy_match_frac=1.0"]


def test_bf16_export_gets_its_own_tolerance():
    assert demo.verdict({**GOOD, "export/logits_max_abs_diff": 0.01, "demo/dtype": "bfloat16"})[0] == 0
    assert demo.verdict({**GOOD, "export/logits_max_abs_diff": 0.01, "demo/dtype": "float32"})[0] == 1


def test_cli_demo_exit_code_follows_the_verdict(monkeypatch, capsys):
    from labkit import cli

    monkeypatch.setattr(demo, "run", lambda **kw: {**GOOD, "rollout/greedy_match": False})
    assert cli.main(["demo", "--json"]) == 1
    err = capsys.readouterr().err
    assert "labkit demo: check failed: greedy match: rollout/greedy_match=False" in err
    monkeypatch.setattr(demo, "run", lambda **kw: dict(GOOD))
    assert cli.main(["demo", "--json"]) == 0


def test_the_closing_lines_say_what_was_shown_and_skip_what_was_not_measured():
    m = {**GOOD, "demo/steps": 10, "export/dir": "runs/demo/exported", "sync/bytes": 2629632,
         "timing/sync/total": 0.063, "per_tensor/timing/sync/total": 0.404, "demo/speedup_bucketed_vs_per_tensor": 6.43,
         "demo/accounted_frac": 1.27, "cold/timing/sync/setup": 0.355, "timing/demo/total": 72.0}
    text = demo.summary(m, [])
    assert text.startswith("labkit demo: every check passed in 72 s")
    assert "0.137 -> 0.122" in text and "bucketed 0.063 s vs per-tensor 0.404 s, 6.4x" in text
    assert "phases sum to 127% of it (they overlap" in text and "runs/demo/exported" in text
    del m["per_tensor/timing/sync/total"]
    assert "warm sync" not in demo.summary(m, [])  # a comparison that was not measured is not printed
    assert demo.summary(m, ["greedy match: ..."]).startswith("labkit demo: 1 check(s) failed")
