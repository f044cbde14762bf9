"""What a weight-update group per sync costs the receiving process, with torch alone (no SGLang, no labkit): rank 1
of a two-process gloo group built as SGLang's `init_custom_process_group` builds it (a TCP rendezvous, a PrefixStore,
`_new_process_group_helper`), one 400 KB broadcast, then `destroy_process_group`, `--cycles` times (arm "per-sync",
what labkit's distributed transport does today); against one group built once and broadcast into `--cycles` times
(arm "kept", what verl and slime do). Rank 1's private memory (USS) after each cycle; slope per 100 cycles after the
first 50. labkit's malloc settings (labkit.cluster.allocator) in both. Writes one JSON file.

    python scripts/gloo_group_churn.py [--cycles 300]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402
from labkit.cluster import allocator  # noqa: E402


def _group(port: int, rank: int):
    import torch
    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world, rendezvous

    store, _, _ = next(rendezvous(f"tcp://127.0.0.1:{port}", rank, 2, timeout=timedelta(seconds=30)))
    pg, _ = _new_process_group_helper(2, rank, [], torch.distributed.Backend("gloo"),
                                      PrefixStore("labkit_weight_update", store), group_name="labkit_weight_update",
                                      timeout=timedelta(seconds=30))
    _world.pg_group_ranks[pg] = {0: 0, 1: 1}
    return pg


def rank_main(rank: int, arm: str, cycles: int, port_file: str) -> None:
    import psutil
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)  # as SGLang
    me, uss, pg = psutil.Process(), [], None
    for i in range(cycles):
        if pg is None:
            path = Path(f"{port_file}.{i}")
            if rank == 0:
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
                s.close()
                path.write_text(str(port))
            else:
                while not path.exists() or not path.read_text():
                    time.sleep(0.001)  # a spinning wait would take one of the box's two cores from rank 0
                port = int(path.read_text())
                path.unlink()
            pg = _group(port, rank)
        t = torch.arange(100_000, dtype=torch.float32) if rank == 0 else torch.empty(100_000)
        dist.broadcast(t, src=0, group=pg)
        if arm == "per-sync":
            dist.destroy_process_group(pg)
            pg = None
        if rank == 1:
            uss.append(me.memory_full_info().uss / 2**20)
    if rank == 1:
        print(json.dumps(uss))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="data/gloo_group_churn_cpu.json")
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a.rank, a.arm, a.cycles, a.port_file)
    prov = provenance.collect(config=vars(a))
    env = dict(os.environ, GLIBC_TUNABLES=allocator.tunables())
    arms = {}
    for arm in ("per-sync", "kept"):
        port_file = tempfile.mktemp()
        cmd = [sys.executable, __file__, "--cycles", str(a.cycles), "--arm", arm, "--port-file", port_file]
        peer = subprocess.Popen([*cmd, "--rank", "0"], env=env)
        out = subprocess.run([*cmd, "--rank", "1"], env=env, capture_output=True, text=True, check=True)
        peer.wait(timeout=60)
        uss = json.loads(out.stdout.strip().splitlines()[-1])
        slope = statistics.linear_regression(range(50, len(uss)), uss[50:]).slope
        arms[arm] = {"uss_mb_per_100_cycles": round(slope * 100, 3), "uss_mb_at_50": round(uss[50], 2),
                     "uss_mb_last": round(uss[-1], 2), "uss_mb_every_25": [round(x, 2) for x in uss[::25]]}
        print(arm, arms[arm], flush=True)
    out = {"command": "python " + " ".join(sys.argv), "provenance": prov, "arms": arms}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
