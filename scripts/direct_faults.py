"""Five faults injected into `transport="direct"` syncs, through `labkit faults`' own harness (a fixed set; `labkit
faults` draws direct trials at random among the others): an exception and a killed trainer half way through the buckets,
a killed engine, a bad tensor, an exception after the last bucket. Each must leave the engine serving the old weights
bitwise and the next sync verified.

    python scripts/direct_faults.py --out data/faults_direct_cpu.json
"""

import argparse
import json
import shutil
import sys
import tempfile

from labkit import provenance
from labkit.lab.faults.harness import Harness
from labkit.lab.faults.plan import FaultsConfig, Trial, counted, half_updated

TRIALS = [Trial("exception", "direct", "sync.bucket", "raise", 0.5),
          Trial("trainer_killed", "direct", "sync.bucket", "wait", 0.6),
          Trial("engine_killed", "direct", "sync.bucket", "wait", 0.5),
          Trial("bad_tensor", "direct", None, None, 0.0),
          Trial("exception", "direct", "sync.version", "raise", 0.0)]
KEYS = ("kind", "point", "fired", "failed", "restored", "state", "recovered", "modified_then_restored",
"served_mid_sync",         "engine_restarted", "trainer_killed", "next_sync_verified", "sync_s", "recover_s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    prov = provenance.collect(config=vars(args))  # the code as the run starts
    workdir, rows = tempfile.mkdtemp(prefix="labkit_faults_"), []
    h = Harness(FaultsConfig(trials=len(TRIALS), progress=False), workdir)
    try:
        rows = [{k: r[k] for k in KEYS} for r in (h.trial(i, t) for i, t in enumerate(TRIALS))]
    finally:
        h.close()
        shutil.rmtree(workdir, ignore_errors=True)
    out = {"command": " ".join(["python scripts/direct_faults.py", *sys.argv[1:]]), "provenance": prov,
           "faults/trials": rows,
           "faults/fired": sum(bool(r["fired"]) for r in rows),
           "faults/recovered": sum(counted(r) for r in rows),
           "faults/half_updated": sum(half_updated(r) for r in rows),
           "faults/served_mid_sync": sum(bool(r["served_mid_sync"]) for r in rows)}
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if out["faults/recovered"] == len(TRIALS) and out["faults/half_updated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
