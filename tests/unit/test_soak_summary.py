"""labkit.lab.soak.summary: the soak's verdict from per-sync rows. Each check is shown failing on rows that break
it (a half-updated engine, a mixed response, a process that grows, a descriptor kept, a sync that slows, a draft
whose acceptance changed with no sync), and passing on a run that breaks nothing."""

import random

import pytest

from labkit.lab.soak.config import SoakConfig
from labkit.lab.soak.summary import MB, summarize

CFG = SoakConfig(warmup=20)
SERVING = {"labkit": {"ok": 90, "spanned": 5, "aborted": 0, "mixed": 0, "failed": 0},
           "openai": {"sent": 40, "checked": 30, "overlapped_sync": 10}}


def _rows(n=120, *, grow_mb=0.0, fds_after=None, slow=0.0, state="new", accept=None, seed=0):
    rng, rows = random.Random(seed), []
    for i in range(n):
        procs = {100: ["driver", int((500 + grow_mb * i / 100 + rng.random() * 0.2) * MB), 40, 9],
                 200: ["scheduler", int(800 * MB + rng.randrange(4096)), 30, 12]}
        if fds_after is not None and i > fds_after:
            procs[200][2] = 31
        row = {"sync": i, "transport": "colocated", "bucket_mb": 0.05, "e2e_s": 1.0 + slow * i + rng.random() * 0.05,
               "pause_s": 0.5 + rng.random() * 0.01, "in_flight": True, "failed": False, "verified": True,
               "error": None, "resources": {"procs": procs, "shm_files": 3, "shm_bytes": 10, "store_bytes": 0}}
        if i % 8 == 7:
            row["fault"] = {"kind": "exception", "transport": "colocated", "point": "sync.begin", "fired": True,
                            "states": [state, "new"], "fenced": [], "engines_agree": True}
        if i % 25 == 24:
            row["acceptance"] = {"version": f"s{i}", "weights": accept or f"w{i}", "accepted": [i % 3, 1],
                                 "accept_rate": 0.3, "repeat_equal": True}
        rows.append(row)
    return rows


def _sum(rows, serving=SERVING):
    return summarize(rows, serving, {"trainer": 0, "engine": 0}, CFG, 1.0, 2.0)


def test_a_run_that_breaks_nothing_passes_and_says_why():
    m = _sum(_rows())
    assert m["soak/ok"] is True and m["soak/half_updated"] == 0 and m["soak/faults_fired"] == m["soak/faults"] == 15
    assert m["soak/rss_within_target"] and m["soak/levels_returned"] and m["soak/no_upward_trend"]
    assert set(m["soak/rss_per_process"]) == {"driver 100", "scheduler 200"}
    assert m["soak/targets_met"] is False  # 120 syncs and 15 faults: short of the 20-minute targets


@pytest.mark.parametrize("rows,key", [
    (_rows(state="neither"), "soak/half_updated"),
    (_rows(grow_mb=3.0), "soak/rss_within_target"),
    (_rows(fds_after=60), "soak/levels_returned"),
    (_rows(slow=0.01), "soak/no_upward_trend"),
    (_rows(accept="same"), "soak/acceptance_changed_at_same_weights"),
])
def test_each_broken_check_fails_the_run(rows, key):
    m = _sum(rows)
    assert m["soak/ok"] is False, key
    assert m[key] is False or (type(m[key]) is int and m[key] > 0), (key, m[key])


def test_a_mixed_or_refused_response_fails_the_run():
    for k in ("mixed", "aborted", "failed"):
        assert _sum(_rows(), {**SERVING, "labkit": {**SERVING["labkit"], k: 1}})["soak/ok"] is False
    assert _sum(_rows(), {**SERVING, "openai": {**SERVING["openai"], "mismatched": 1}})["soak/ok"] is False


def test_a_fault_that_never_fired_fails_the_run():
    rows = _rows()
    rows[7]["fault"]["fired"] = False
    assert _sum(rows)["soak/ok"] is False


def test_pauses_are_found_by_time_once_the_handles_deque_is_full():
    """EngineHandle.pauses keeps the last 64: counting entries before and after a sync read 0 s for every sync
    after the 64th, and a soak's pause trend read zeros from there on)."""
    import collections

    from labkit.lab.bench.serve import paused_within

    pauses = collections.deque(((float(i), i + 0.5) for i in range(64)), maxlen=64)
    pauses.append((100.0, 100.25))
    assert len(pauses) == 64 and paused_within(pauses, 99.0, 101.0) == 0.25
    pauses.append((102.0, None))  # still paused at the end of the window
    assert paused_within(pauses, 101.5, 103.0) == 1.0


def test_the_series_shows_where_a_descriptor_stepped():
    m = _sum(_rows(fds_after=60))
    assert m["soak/series"]["fds"]["scheduler 200"] == [[0, 30], [61, 31]]
    assert m["soak/series"]["threads"]["driver 100"] == [[0, 9]]


def test_the_driver_threads_that_came_or_went_are_listed_by_sync():
    rows = _rows()
    rows[86]["driver_threads"] = {"added": ["native:grpc_global_tim"], "gone": []}
    assert _sum(rows)["soak/driver_threads"] == [{"sync": 86, "added": ["native:grpc_global_tim"], "gone": []}]
    assert _sum(_rows())["soak/driver_threads"] == []


def test_an_aborted_soak_says_where_it_stopped():
    from labkit.lab.soak.run import where

    def inner():
        raise TimeoutError("x")

    try:
        inner()
    except TimeoutError as e:
        said = where(e)
    assert said.startswith("test_soak_summary.py:") and " inner <- " in said and said.endswith(
        "test_an_aborted_soak_says_where_it_stopped"), said


def test_a_process_restarted_mid_run_warms_up_as_long_as_the_run_did():
    """A trainer rank restarted after a fault climbs while it meets each transport and bucket size for the first
    time (data/soak_cpu.json at 3e7a957: +30 MB, then steps for ten syncs and more): its slope is judged only
    after `warmup` syncs of its own life, and one that dies sooner is reported too short, with its life."""
    rows = _rows(150)
    for r in rows:
        i = r["sync"]
        if 40 <= i:  # restarted at sync 40: climbs 1 MB a sync for 25 syncs, then flat
            r["resources"]["procs"][300] = ["trainer rank", int((600 + min(i - 40, 25)) * MB), 50, 90]
        if 100 <= i < 125:  # restarted at 100, killed 25 syncs later
            r["resources"]["procs"][400] = ["trainer rank", int(600 * MB), 50, 90]
            r["resources"]["procs"][400][2] = 50 + (i > 110)  # a descriptor during its warm-up is no leak
    cfg = SoakConfig(warmup=30)
    m = summarize(rows, SERVING, {"trainer": 2}, cfg, 1.0, 2.0)
    assert m["soak/rss_per_process"]["trainer rank 300"]["from_sync"] == 40 + cfg.warmup
    assert m["soak/rss_per_process"]["trainer rank 300"]["within"] is True
    assert m["soak/rss_too_short"] == {"trainer rank 400": 25}
    assert m["soak/levels_returned"] is True


def test_levels_are_read_between_syncs_with_no_engine_restart_in_flight():
    rows = _rows()
    rows[70]["resources"]["store_bytes"], rows[70]["reviving"] = 113 * MB, [1]  # the restart's objects in flight
    m = _sum(rows)
    assert m["soak/levels_returned"] is True and m["soak/levels_samples_reviving"] == 1
    for r in rows[71:]:
        r["resources"]["store_bytes"] = 1  # still there once the restart is done: a leak
    assert _sum(rows)["soak/levels_exceeded"] == {"store_bytes": 1}


def test_a_level_above_at_one_reading_and_back_at_the_next_was_in_flight_not_kept():
    """A daemon polling on its own timer holds a connection for a moment, and a reading can land on it."""
    rows = _rows()
    rows[80]["resources"]["procs"][200][2] = 34  # the scheduler's 30 descriptors, +4 at one reading
    assert _sum(rows)["soak/levels_returned"] is True
    rows[81]["resources"]["procs"][200][2] = 32  # still +2 at the next: kept
    assert _sum(rows)["soak/levels_exceeded"] == {"fds scheduler 200": 2}
    rows[-1]["resources"]["store_bytes"] = 5  # above at the last reading: nothing after it says it came back
    assert _sum(rows)["soak/levels_exceeded"]["store_bytes"] == 5


def test_the_reading_after_the_loop_confirms_or_clears_the_last_syncs_level():
    """The run reads once more after its last sync (`final`): a transient there is cleared, a leak kept; the
    confirming reading is never judged alone (it has no next one either)."""
    import copy

    rows = _rows()
    rows[-1]["resources"]["procs"][200][2] = 33  # the scheduler +3 descriptors at the last sync's reading
    final = copy.deepcopy(rows[-2]["resources"])

    def levels(final):
        return summarize(rows, SERVING, {"trainer": 0}, CFG, 1.0, 2.0, None, final)["soak/levels_exceeded"]

    assert levels(final) == {} and _sum(rows)["soak/levels_exceeded"] == {"fds scheduler 200": 3}
    final["procs"][200][2] = 32
    assert levels(final) == {"fds scheduler 200": 2}  # still above after the loop: kept
    rows[-1]["resources"]["procs"][200][2] = 30
    final["procs"][200][2] = 40  # above only at the confirming reading: it confirms, it is not judged
    assert levels(final) == {}


def test_a_cache_with_a_cap_of_its_own_is_judged_against_the_cap():
    """Ray's log monitor holds two more descriptors per worker started until it reaches its cap, then closes all."""
    rows = _rows()
    for r in rows:
        r["resources"]["procs"][500] = ["ray log_monitor", 100 * MB, 25 + 2 * (r["sync"] // 10) % 32, 15]
    bounds = {"fds ray log_monitor": 32}
    m = summarize(rows, SERVING, {"trainer": 0}, CFG, 1.0, 2.0, bounds)
    assert m["soak/levels_returned"] is True and m["soak/levels_bounded"]["fds ray log_monitor 500"]["cap"] == 32
    assert _sum(rows)["soak/levels_exceeded"].get("fds ray log_monitor 500", 0) > 0  # without the cap: a leak
    for r in rows:
        r["resources"]["procs"][500][2] = 25 + r["sync"]  # past the cap: a leak either way
    assert summarize(rows, SERVING, {"trainer": 0}, CFG, 1.0, 2.0, bounds)["soak/levels_returned"] is False


def test_pages_of_ray_object_store_a_process_maps_are_not_its_growth():
    """The driver reads objects from Ray's shared arena: each page it touches stays in its RSS, bounded by the store
    (labkit.lab.soak.resources.store_pages). Those pages are set aside; the same growth held by the process fails."""
    rows = _rows(grow_mb=3.0)
    for r in rows:  # all of the driver's growth is store pages (and stays there)
        p = r["resources"]["procs"][100]
        p += [0, int(3.0 * r["sync"] / 100 * MB)]
    m = _sum(rows)
    assert m["soak/rss_within_target"] is True and m["soak/ok"] is True
    assert m["soak/series"]["store_pages_mb"]["driver 100"][-1][1] == pytest.approx(3.0 * 119 / 100, abs=0.01)
    for r in rows:
        r["resources"]["procs"][100][5] = 0  # the same growth, none of it the store's: a leak
    assert _sum(rows)["soak/rss_within_target"] is False
