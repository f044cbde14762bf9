"""The pure half of `labkit bench serve-sync`: one response (tokens + meta_info) -> ok / spanned / aborted /
mixed, against each version's greedy output."""

import pytest

from labkit.lab.bench.serve import ServeBenchConfig, classify, summarize_mode

REFS = {"v1": [1, 2, 3, 4], "v2": [1, 2, 9, 9]}
CONT = {("v2", 2): [7, 7]}  # v2's greedy continuation of prompt + [1, 2]


def expected(version, start):
    return REFS.get(version) if start == 0 else CONT.get((version, start))


def meta(version, spans=None, finish="length"):
    m = {"weight_version": version, "finish_reason": {"type": finish}}
    if spans:
        m["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in spans]
    return m


def test_one_version_that_it_reports_is_ok():
    assert classify([1, 2, 3, 4], meta("v1"), expected) == "ok"
    assert classify([1, 2, 9, 9], meta("v2", [("v2", 0, 4)]), expected) == "ok"


def test_tokens_of_another_version_than_reported_or_of_none_are_mixed():
    assert classify([1, 2, 3, 4], meta("v2"), expected) == "mixed"
    assert classify([1, 2, 3, 9], meta("v1"), expected) == "mixed"  # half v1, half v2: matches no version
    assert classify([1, 2, 3, 4], meta("v0"), expected) == "mixed"  # unknown version never counts as ok
    assert classify([1, 2, 3], meta("v1"), expected) == "mixed"  # truncated


def test_reported_spans_are_checked_span_by_span():
    assert classify([1, 2, 7, 7], meta("v2", [("v1", 0, 2), ("v2", 2, 4)]), expected) == "spanned"
    # the continuation is not v2's greedy continuation of the prefix
    assert classify([1, 2, 9, 9], meta("v2", [("v1", 0, 2), ("v2", 2, 4)]), expected) == "mixed"
    # the prefix is not v1's
    assert classify([5, 2, 7, 7], meta("v2", [("v1", 0, 2), ("v2", 2, 4)]), expected) == "mixed"
    # no reference for that continuation: unknown is not ok
    assert classify([1, 7, 7, 7], meta("v2", [("v1", 0, 1), ("v2", 1, 4)]), expected) == "mixed"


def test_aborted_is_not_mixed():
    assert classify([1], meta("v1", finish="abort"), expected) == "aborted"


def test_summary_counts_requests_in_flight_during_a_sync():
    rows = [{"outcome": "ok", "t0": 0.0, "t1": 1.0, "meta": {}}, {"outcome": "mixed", "t0": 2.0, "t1": 5.0,
                                                                   "meta": {"num_retractions": 1}},
            {"outcome": "failed", "t0": 6.0, "t1": 7.0, "error": "x"}]
    s = summarize_mode(rows, [{"sync": (1.5, 3.0), "paused_s": 1.0}], [])
    assert (s["requests"], s["ok"], s["mixed"], s["failed"], s["retracted"], s["in_flight_during_sync"]) == \
        (3, 1, 1, 1, 1, 1)


def test_config_is_validated():
    with pytest.raises(ValueError, match="modes"):
        ServeBenchConfig(modes=("pause",))
    with pytest.raises(ValueError, match="syncs"):
        ServeBenchConfig(syncs=0)


def test_in_place_is_refused_by_the_atomic_guard_and_reported_not_failed():
    from labkit.lab.bench.serve import summarize
    from labkit.sync.config import SyncConfig

    with pytest.raises(ValueError, match="pause_mode='in_place' is refused by the atomic guard"):
        SyncConfig(pause_mode="in_place")
    assert SyncConfig(pause_mode="in_place", atomic=False).pause_mode == "in_place"  # the bare transport may
    good = {"requests": 3, "mixed": 0, "aborted": 0, "retracted": 0, "spanned": 0, "failed": 0,
            "in_flight_during_sync": 2, "pause_seconds": 0.1, "sync_seconds": 0.2, "sync_failed": 0, "errors": [],
            "ok": 3}
    refs = {"v0": {0: [1]}, "v1": {0: [2]}}
    out = summarize({"retract": good, "in_place": {"refused": "no"}}, refs, 0.1,
                    ServeBenchConfig(modes=("retract", "in_place")), 1.0)
    assert out["serve/ok"] is True and out["serve/refused/in_place"] == "no"
    out = summarize({"in_place": {"refused": "no"}}, refs, 0.1, ServeBenchConfig(modes=("in_place",)), 1.0)
    assert out["serve/ok"] is False  # nothing measured is not a pass


class _Greedy:
    """A stand-in engine whose greedy next token is a function of the whole context (so a continuation taken
    from a longer generation is right only if it is a true prefix); it counts its requests."""

    weight_version = "v2"

    def __init__(self):
        self.calls = 0

    @staticmethod
    def next_token(ctx):
        return (sum(ctx) * 7 + len(ctx)) % 50

    def generate(self, input_ids, sampling):
        self.calls += 1
        outs = []
        for ids in input_ids:
            ctx = list(ids)
            for _ in range(sampling["max_new_tokens"]):
                ctx.append(self.next_token(ctx))
            outs.append({"tokens": ctx[len(ids):]})
        return outs


def test_spanned_rows_are_checked_against_one_batched_continuation_request():
    from labkit.lab.bench.serve import _check

    engine, prompts, n = _Greedy(), [[3, 4], [5]], 6
    cfg = ServeBenchConfig(max_new_tokens=n)
    greedy = {p: engine.generate([ids], {"max_new_tokens": n})[0]["tokens"] for p, ids in enumerate(prompts)}

    def spanned(p, start, prefix):  # v1 up to `start` (prefix), then v2's greedy continuation
        cont = engine.generate([prompts[p] + prefix], {"max_new_tokens": n - start})[0]["tokens"]
        return {"prompt": p, "tokens": prefix + cont, "meta": meta("v2", [("v1", 0, start), ("v2", start, n)])}

    rows = [spanned(0, 2, [9, 9]), spanned(1, 4, [1, 2, 3, 4]), {"prompt": 0, "tokens": greedy[0], "meta": meta("v2")},
            {"prompt": 1, "error": "x"}]
    rows.append(dict(rows[1], tokens=rows[1]["tokens"][:-1] + [49 - rows[1]["tokens"][-1]]))  # a wrong last token
    refs = {"v1": {0: [9, 9, 0, 0, 0, 0], 1: [1, 2, 3, 4, 0, 0]}, "v2": greedy}
    engine.calls = 0
    _check(rows, prompts, refs, engine, cfg)
    assert [r["outcome"] for r in rows] == ["spanned", "spanned", "ok", "failed", "mixed"]
    assert engine.calls == 1
