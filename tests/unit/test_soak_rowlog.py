"""labkit.lab.soak.rowlog: the soak's rows leave the driver's memory (the driver is judged like every process) and
come back for the verdict unchanged in what the summary reads."""

import random
import tracemalloc

from labkit.lab.soak.config import SoakConfig
from labkit.lab.soak.rowlog import RowLog
from labkit.lab.soak.summary import summarize


def _row(i: int, rng: random.Random) -> dict:
    procs = {10_000 + k: [f"role {k % 7}", 700 * 2**20 + rng.randrange(2**20), 40 + k, 9, 2**20 * k]
             for k in range(30)}  # a run's ~30 processes
    return {"sync": i, "transport": "colocated", "bucket_mb": 0.05, "e2e_s": 1.0 + rng.random() * 0.1,
            "pause_s": 0.5, "in_flight": True, "failed": False, "verified": True, "error": None,
            "resources": {"procs": procs, "shm_files": 3, "shm_bytes": 10, "store_bytes": 0},
            "step_s": {"train": 0.1, "sync": 1.0}}


def _grown_by(keep) -> int:
    rng = random.Random(0)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            keep(_row(i, rng))
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_rows_written_to_the_log_do_not_stay_in_memory(tmp_path):
    held: list[dict] = []
    log = RowLog(tmp_path / "rows.jsonl")
    in_list, in_log = _grown_by(held.append), _grown_by(log.append)
    log.close()
    assert in_list > 2**20, in_list  # why: 300 rows in a list are over 1 MB, the whole 1 MB / 100 syncs target
    assert in_log < 64 * 1024, in_log


def test_the_summary_of_rows_read_back_is_the_summary_of_the_rows():
    rng, cfg = random.Random(1), SoakConfig(warmup=20)
    rows = [_row(i, rng) for i in range(80)]
    log = RowLog()
    for r in rows:
        log.append(r)
    back, path = log.rows(), log.path
    log.close()
    assert not path.exists()  # a log it made itself is removed
    serving = {"labkit": {"ok": 1, "spanned": 0, "aborted": 0, "mixed": 0, "failed": 0}, "openai": {}}
    a, b = (summarize(x, serving, {"trainer": 0}, cfg, 1.0, 2.0) for x in (rows, back))
    for k in ("soak/rss_per_process", "soak/levels_exceeded", "soak/trend/e2e_s", "soak/series", "soak/ok"):
        assert a[k] == b[k], k
