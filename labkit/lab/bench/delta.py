"""`labkit bench delta`: full syncs against delta syncs into an engine serving bf16, over a short run of small steps.

The case delta sync is for: the trainer holds fp32 master weights, the engine serves bf16, and after a small step
(lr 1e-5, the scale of RL post-training) most bf16 words round to what they were. Per transport, two arms of
equal length, one after the other on the same trainer and engine: `full` (every byte, `delta=0`), then `delta`
(its first sync is the anchor, untimed like the full arm's warm-up; then deltas). One training step precedes
every timed sync, so each sync moves changed weights. Each sync runs with the defaults (atomic guard, checksum
verification against the trainer's full export), so every delta sync is checked bitwise against a full export.

Reported beside each other: bytes on the wire, the weight-moving seconds (gather, pack, encode, transfer, load:
what delta changes) and the end-to-end seconds (what a caller of `sync()` waits for; verification hashes the
whole model either way).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from labkit.config import ModelSpec
from labkit.engine.config import EngineConfig
from labkit.models.tiny import BENCH_SPEC
from labkit.sync.config import SyncConfig
from labkit.workbench.core import FINETUNE, Workbench
from labkit.lab.bench.sync import bench_model_dir, transport_seconds, verdict

DELTA_LR = 1e-5  # the step size; RL post-training runs 1e-6..1e-5
DELTA_TRANSPORTS = ("colocated", "distributed")  # the transports that carry a delta


def bench_delta(spec: ModelSpec | str = BENCH_SPEC, bucket_mb: float = 32.0, syncs: int = 5, anchor_every: int = 8,
                transports: tuple[str, ...] = DELTA_TRANSPORTS, workdir: str | Path = "runs/bench-delta",
                progress: bool = True) -> dict:
    """Per transport: `syncs` timed full syncs, then `syncs` timed delta syncs (anchor every `anchor_every`,
    more than `syncs`, so the timed ones are deltas; the anchor's own time is reported)."""
    from tqdm.auto import tqdm

    model_dir = bench_model_dir(spec, workdir)
    engine_cfg = EngineConfig(model_dir=model_dir, dtype="bfloat16", max_total_tokens=4096, mem_fraction_static=0.05)
    runs: dict[str, dict[str, list[dict]]] = {}
    verified, out = [], {}
    with Workbench(model_dir, train_cfg=replace(FINETUNE, lr=DELTA_LR), engine_cfg=engine_cfg,
                   progress=progress) as wb:
        out["bench/startup_s"] = wb.timings["timing/startup"]
        before = wb.engine.checksums()
        bar = tqdm(total=len(transports) * 2 * (1 + syncs), desc="bench delta", disable=not progress)
        for t in transports:
            runs[t] = {}
            for arm, delta in (("full", 0), ("delta", anchor_every)):
                cfg = SyncConfig(transport=t, bucket_mb=bucket_mb, delta=delta, progress=False)
                first = _timed(wb, cfg)  # full: warm-up; delta: the anchor (the copy is made here)
                bar.update()
                timed = []
                for _ in range(syncs):
                    wb.train(1, progress=False)
                    timed.append(_timed(wb, cfg))
                    bar.update()
                runs[t][arm] = [first] + timed
                verified += [m["sync/verified"] is True for m in timed]
        bar.close()
        after = wb.engine.checksums()
    for t in transports:
        out.update(_summary(t, runs[t]))
    out.update({f"bench/delta/{k.removeprefix('bench/')}": v for k, v in verdict(verified, before, after).items()})
    out.update({"bench/delta/lr": DELTA_LR, "bench/delta/engine_dtype": "bfloat16", "bench/delta/syncs": syncs,
                "bench/delta/anchor_every": anchor_every, "bench/delta/bucket_bytes": runs[transports[0]]["full"][1][
                    "sync/bucket_bytes"], "bench/delta/model_bytes": runs[transports[0]]["full"][1]["sync/bytes"]})
    return out


def _timed(wb, cfg: SyncConfig) -> dict:
    t0 = time.perf_counter()
    m = wb.sync(cfg)
    m["bench/wall"] = time.perf_counter() - t0
    return m


def _summary(t: str, arms: dict[str, list[dict]]) -> dict:
    """Medians over the timed syncs of each arm (index 0 is the warm-up / anchor)."""
    med = {arm: {k: statistics.median(f(m) for m in ms[1:]) for k, f in
                 (("wall", lambda m: m["bench/wall"]), ("moving", transport_seconds),
                  ("wire", lambda m: m["sync/wire_bytes"]), ("changed", lambda m: m.get("sync/changed_fraction", 1.0)))}
           for arm, ms in arms.items() if arm in ("full", "delta")}
    full, delta = med["full"], med["delta"]
    nbytes = arms["full"][1]["sync/bytes"]
    return {
        f"bench/delta/changed_fraction/{t}": round(delta["changed"], 5),
        f"bench/delta/changed_fraction_all/{t}": [m["sync/changed_fraction"] for m in arms["delta"][1:]],
        f"bench/delta/kinds/{t}": [m["sync/delta"] for m in arms["delta"]],
        f"bench/delta/wire_bytes/{t}": int(delta["wire"]),
        f"bench/delta/wire_ratio/{t}": round(delta["wire"] / nbytes, 4),
        f"bench/delta/seconds/full/{t}": round(full["moving"], 4),
        f"bench/delta/seconds/delta/{t}": round(delta["moving"], 4),
        f"bench/delta/time_ratio/{t}": round(delta["moving"] / full["moving"], 3),
        f"bench/delta/end_to_end_seconds/full/{t}": round(full["wall"], 4),
        f"bench/delta/end_to_end_seconds/delta/{t}": round(delta["wall"], 4),
        f"bench/delta/time_ratio_end_to_end/{t}": round(delta["wall"] / full["wall"], 3),
        f"bench/delta/anchor_end_to_end_seconds/{t}": round(arms["delta"][0]["bench/wall"], 4),
        f"bench/delta/phases/{t}": {arm: {k.removeprefix("timing/sync/"): round(statistics.median(
            m[k] for m in ms[1:]), 4) for k in ms[1] if k.startswith("timing/sync/")} for arm, ms in arms.items()},
    }
