"""The trainer's intra-op threads while a CPU sync streams (`SyncConfig.host_threads`), A/B in one workbench:
every sync of arm A is followed by one of arm B (the order alternating), per transport, transport-only (the bench's
weight-moving seconds, no verification, no guard) and end to end (the defaults: guard, checksums; wall time).
Interleaving keeps the box's drift out of the comparison; writes one JSON file.

    python scripts/host_threads_ab.py [--model PATH] [--syncs 15] [--threads-a 2] [--out data/host_threads_ab_cpu.json]

`--threads-a` is the arm that uses every core (2 on the 2-core box); arm B is labkit's default (None: every core
but the engine's one, labkit.sync.bucket.host_threads)."""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402
from labkit.sync import SyncConfig  # noqa: E402
from labkit.sync.bucket import host_threads  # noqa: E402
from labkit.workbench.core import Workbench  # noqa: E402
from labkit.lab.bench.sync import BENCH_SPEC, bench_model_dir, transport_seconds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a model dir or family preset (default: the sync bench's model)")
    ap.add_argument("--syncs", type=int, default=15)
    ap.add_argument("--threads-a", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--transports", default="colocated,direct,distributed")
    ap.add_argument("--out", default="data/host_threads_ab_cpu.json")
    a = ap.parse_args()
    prov = provenance.collect(config=vars(a))  # the code as the run starts
    arms = {f"threads_{a.threads_a}": a.threads_a, "default": None}
    used = {}
    for arm, n in arms.items():  # the threads each arm's CPU syncs run with (labkit.sync.bucket.host_threads)
        with host_threads("cpu", n) as use:
            used[arm] = use
    samples: dict[str, list[float]] = {}
    with Workbench(bench_model_dir(a.model or BENCH_SPEC, "runs/bench")) as wb:
        for t in a.transports.split(","):
            for kind, kw in (("transport_only", dict(verify="none", atomic=False)), ("end_to_end", {})):
                cfgs = {arm: SyncConfig(transport=t, bucket_mb=32, progress=False, host_threads=n, **kw)
                        for arm, n in arms.items()}
                for cfg in cfgs.values():
                    wb.sync(cfg)  # warm-up: plan, buffers, guard
                for i in range(a.syncs):
                    for arm in (list(cfgs) if i % 2 else list(cfgs)[::-1]):
                        t0 = time.perf_counter()
                        m = wb.sync(cfgs[arm])
                        wall = time.perf_counter() - t0
                        if m["sync/verified"] is False:
                            raise SystemExit(f"{t} {arm}: a sync did not verify")
                        value = transport_seconds(m) if kind == "transport_only" else wall
                        samples.setdefault(f"{t}/{kind}/{arm}", []).append(round(value, 5))
    out = {"command": "python scripts/host_threads_ab.py " + " ".join(sys.argv[1:]), "provenance": prov,
           "cpu_count": os.cpu_count(),
           "arms": arms, "threads": used, "median_s": {k: round(statistics.median(v), 5) for k, v in samples.items()},
           "best_s": {k: min(v) for k, v in samples.items()}, "samples_s": samples}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["median_s"], indent=1))


if __name__ == "__main__":
    main()
