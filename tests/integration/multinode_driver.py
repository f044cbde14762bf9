"""A driver for tests/integration/test_multinode.py, run as its own process against RAY_ADDRESS (the test
session's pytest process is attached to its own local Ray). Trainer on the `trainer` node, two engines on the
`engine` node: a colocated sync refused, one broadcast into both, then one with engine 1 crashing mid-sync. Prints
one JSON object of facts; the test asserts on them."""

import json
import sys

from labkit import failpoints as fpt
from labkit.cluster.placement import PlacementSpec
from labkit.sync import SyncConfig
from labkit.sync.atomic import SyncFailed
from labkit.workbench import Workbench

CFG = dict(bucket_mb=0.5, progress=False, timeout_s=30.0)


def main() -> dict:
    spec = PlacementSpec(mode="disaggregated", engines=2, trainer_resource="trainer", engine_resource="engine")
    out = {}
    with Workbench(placement=spec, progress=False) as wb:
        before = [e.checksums() for e in wb.engines]
        try:  # shared memory cannot cross nodes: refused while the sync prepares
            wb.sync(SyncConfig(transport="colocated", **CFG))
            out["colocated"] = "synced"
        except SyncFailed as e:
            out["colocated"] = str(e)
        out["unchanged_after_refusal"] = [e.checksums() for e in wb.engines] == before
        out["versions_after_refusal"] = [e.weight_version for e in wb.engines]
        wb.train(1, batch_size=8, progress=False)
        m = wb.sync(SyncConfig(transport="distributed", **CFG), weight_version="r1")  # one broadcast, both engines
        out["broadcast"] = {k: v for k, v in m.items() if k.startswith(("sync/", "timing/sync/engine/"))}
        out["greedy_after_broadcast"] = wb.compare_greedy().metrics["rollout/greedy_match"]
        wb.train(1, batch_size=8, progress=False)
        fpt.arm_in_actor(wb.engines[1]._actor, "engine.apply", "crash", 2, match=".k_proj.")  # exits mid-sync
        m = wb.sync(SyncConfig(transport="distributed", **CFG), weight_version="r2")
        out["crash"] = {k: v for k, v in m.items() if k.startswith("sync/")}
        out["live_version"] = wb.engines[0].weight_version
        out["greedy_after_crash"] = wb.compare_greedy().metrics["rollout/greedy_match"]
    return out


if __name__ == "__main__":
    print(json.dumps(main(), default=str), flush=True)
    sys.exit(0)
