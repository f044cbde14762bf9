"""What reading Ray's object store costs the processes a soak measures, A/B: arm "ray" reads it as Ray's
`internal_api.get_memory_info_reply` does (a new gRPC channel to the raylet per reading), arm "kept" through
labkit's `StoreReader` (one channel). Each run is its own local Ray (labkit's settings) and driver process; between
readings the driver makes one actor call with a 200 KB argument (in the object store, as a bucket is). Arms
alternate run by run. Per run: the driver's gRPC event-engine threads at every reading (`native:event_engine`),
and the raylet's and the GCS's private memory (USS) slope per 100 readings after the first 50. Writes one JSON file.

    python scripts/store_reader_ab.py [--runs 2] [--readings 400]
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402

RUN = r"""
import json, sys, time
import psutil, ray
from labkit.cluster import runtime
from labkit.lab.soak import resources

arm, n = sys.argv[1], int(sys.argv[2])
runtime.init(num_cpus=2)

@ray.remote(num_cpus=0)
class Peer:
    def f(self, b):
        return len(b)

peer = Peer.remote()
ray.get(peer.f.remote(b"x"))
if arm == "ray":
    from ray._private import internal_api, state
    read = lambda: internal_api.get_memory_info_reply(state.state).store_stats.object_store_bytes_used
else:
    read = resources.object_store

def daemon(exe):
    return next(p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].endswith(exe))

raylet, gcs = daemon("/raylet"), daemon("/gcs_server")
rows = []
for i in range(n):
    ray.get(peer.f.remote(b"y" * 200_000))
    read()
    rows.append([i, resources.thread_names()["native:event_engine"], raylet.memory_full_info().uss,
                 gcs.memory_full_info().uss])
    time.sleep(0.2)
print(json.dumps(rows))
runtime.shutdown()
"""


def slope_per_100(rows: list, k: int, skip: int = 50) -> float:
    xs, ys = [r[0] for r in rows[skip:]], [r[k] / 2**20 for r in rows[skip:]]
    return round(statistics.linear_regression(xs, ys).slope * 100, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--readings", type=int, default=400)
    ap.add_argument("--out", default="data/soak_store_reader_cpu.json")
    a = ap.parse_args()
    prov = provenance.collect(config=vars(a))
    runs = []
    for r in range(a.runs):
        for arm in ("ray", "kept"):
            out = subprocess.run([sys.executable, "-c", RUN, arm, str(a.readings)], capture_output=True, text=True,
                                 check=True, cwd=Path(__file__).resolve().parents[1])
            rows = json.loads(out.stdout.strip().splitlines()[-1])
            pool = [x[1] for x in rows]
            runs.append({"arm": arm, "run": r, "readings": len(rows), "event_engine_threads_min": min(pool),
                         "event_engine_threads_max": max(pool),
                         "event_engine_changes": sum(x != y for x, y in zip(pool, pool[1:])),
                         "raylet_uss_mb_per_100": slope_per_100(rows, 2), "gcs_uss_mb_per_100": slope_per_100(rows, 3)})
            print(json.dumps(runs[-1]), flush=True)
    summary = {arm: {k: statistics.median(x[k] for x in runs if x["arm"] == arm)
                     for k in ("event_engine_changes", "raylet_uss_mb_per_100", "gcs_uss_mb_per_100")}
               for arm in ("ray", "kept")}
    out = {"command": "python " + " ".join(sys.argv), "provenance": prov, "runs": runs, "median": summary}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
