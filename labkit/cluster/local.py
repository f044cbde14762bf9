"""A Ray cluster of several nodes on this one machine: each node its own raylet, all on 127.0.0.1, each with
its own logical resources (Ray's own multi-node test cluster, `ray.cluster_utils.Cluster`).

Why: placement, rendezvous addresses and transports must be shown to work when trainer and engine are on
different Ray nodes, and a CPU box has one host. Held to loopback and token auth like every local run
(labkit.cluster.runtime): the nodes listen on 127.0.0.1 only and accept no work without the run's token.

    python -m labkit.cluster.local --node trainer=4 --node engine=4 -- \\
        labkit sync --placement disaggregated --transport distributed \\
        --trainer-resource trainer --engine-resource engine --json

starts a head node offering 4 CPUs and the custom resource `trainer`, a second node offering 4 CPUs and
`engine`, runs the command with `RAY_ADDRESS` (and the token) in its environment, and takes the cluster down
when it ends. Without a command it prints `RAY_ADDRESS=...` and holds the cluster until interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from labkit.cluster import runtime
from labkit.config import check

NODE = re.compile(r"^([A-Za-z_][\w.-]*)=(\d+)$")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: the custom resource it offers (named like the role it hosts) and its logical CPUs."""

    resource: str
    cpus: int = 4

    @classmethod
    def parse(cls, text: str) -> NodeSpec:
        m = NODE.match(text)
        check(m is not None and int(m.group(2)) >= 1, "--node", text, "RESOURCE=CPUS, e.g. trainer=4")
        return cls(m.group(1), int(m.group(2)))


class LocalCluster:
    """Start the nodes (head first) on 127.0.0.1 with token auth; `address`, `env()` for a driver; `shutdown()`."""

    def __init__(self, nodes: list[NodeSpec], object_store_mb: int = 200):
        check(len(nodes) >= 1, "nodes", nodes, "at least one NodeSpec")
        runtime.local_security()  # loopback and a fresh token, in this process's environment (the nodes inherit it)
        from ray.cluster_utils import Cluster

        store = object_store_mb * 1024 * 1024
        common = dict(node_ip_address="127.0.0.1", object_store_memory=store)
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=nodes[0].cpus, resources={nodes[0].resource: nodes[0].cpus}, include_dashboard=False, **common))
        try:
            for n in nodes[1:]:
                self.cluster.add_node(num_cpus=n.cpus, resources={n.resource: n.cpus}, **common)
            self.cluster.wait_for_nodes()
        except BaseException:
            self.cluster.shutdown()
            raise
        self.nodes = nodes

    @property
    def address(self) -> str:
        return self.cluster.address

    def env(self) -> dict:
        """What a driver's environment needs to attach: the address, loopback, the token."""
        keep = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "GLOO_SOCKET_IFNAME")
        return {"RAY_ADDRESS": self.address, **{k: os.environ[k] for k in keep if k in os.environ}}

    def shutdown(self) -> None:
        self.cluster.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(prog="python -m labkit.cluster.local", description=__doc__.split("\n\n")[0])
    p.add_argument("--node", action="append", required=True, help="RESOURCE=CPUS, once per node (head first)")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        nodes = [NodeSpec.parse(n) for n in args.node]
    except ValueError as e:
        p.error(str(e))
    if not cmd and "RAY_AUTH_TOKEN" not in os.environ and os.environ.get("RAY_AUTH_MODE", "token") != "disabled":
        p.error("without a command, export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<a secret> first: the shells that "
                "attach (RAY_ADDRESS=...) need the same token")
    t0 = time.perf_counter()
    with LocalCluster(nodes) as c:
        print(f"labkit: {len(nodes)} Ray nodes on 127.0.0.1 ({', '.join(f'{n.resource}={n.cpus}' for n in nodes)}) "
              f"in {time.perf_counter() - t0:.0f} s; RAY_ADDRESS={c.address}", file=sys.stderr, flush=True)
        if cmd:
            return subprocess.run(cmd, env={**os.environ, **c.env()}).returncode
        print(f"RAY_ADDRESS={c.address}", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` takes the nodes down too
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
