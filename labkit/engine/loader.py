"""What the driver side asks of labkit's engine-side loader (labkit.engine.inside.apply runs inside SGLang's scheduler).

Mixed into EngineHandle (labkit.engine.handle): whether the engine lists the loader, what it applied in the last
sync, whether the model routes labkit payloads, and the tensors a payload name carries (for the contract check
before a distributed call). The loader module itself imports torch, so it is imported here only when asked.
"""

from __future__ import annotations

import json
import os
import tempfile

from labkit.engine.inside.direct import AGAIN, SHARE_PREFIX  # pure (json): no torch


class LoaderQueries:
    """Needs `self._b` (an EngineBackend) and the caches `self._loaders`, `self._routes`, `self._checksum` (None:
    not asked yet)."""

    def accepts(self, load_format: str) -> bool:
        """Whether the engine was launched with `load_format` among its custom weight loaders (asked once)."""
        if self._loaders is None:
            self._loaders = tuple(self._b.custom_weight_loaders())
        return load_format in self._loaders

    def apply_stats(self) -> list[int]:
        """[tensors labkit's loader copied by plan, tensors it passed to load_weights] since the last call; the
        loader releases the kept buffers this sync did not use (labkit.engine.inside.apply.end_sync)."""
        from labkit.engine.inside.apply import STATS_NAME

        rows = self._b.get_weights_by_name(STATS_NAME, 1)
        return [int(v) for v in rows[0]] if rows else [0, 0]

    def apply_path(self) -> str:
        """`sync/apply_path` of the sync that just ended (reads and resets `apply_stats`)."""
        copied, fallback = self.apply_stats()
        return "copy_plan" if not fallback else "mixed" if copied else "load_weights"

    def node(self) -> dict:
        """The engine's node as Ray reports it ({"node_id", "node_ip"}; an HTTP engine: its URL's host, no id):
        whether a transport that hands over a memory handle can reach it (labkit.cluster.placement.cross_node)."""
        return self._b.node()

    def checksum_algo(self) -> str:
        """The hash the engine's weight checker runs on CPU tensors (labkit.engine.checksum): xxh3_64 where labkit's
        model classes installed it, else SGLang's sha256. Asked once."""
        if self._checksum is None:
            from labkit.engine.checksum import CHECKSUM_NAME

            rows = self._b.get_weights_by_name(CHECKSUM_NAME, 1)
            self._checksum = "xxh3_64" if rows and rows[0] and int(rows[0][0]) == 1 else "sha256"
        return self._checksum

    def checksum_memo(self) -> dict:
        """The engine's checksum memo (labkit.engine.inside.checkmemo): {"on": answering from it at all,
        "hits": checksum requests answered from it so far}; off on an engine without labkit's model classes."""
        from labkit.engine.checksum import CHECKSUM_NAME

        rows = self._b.get_weights_by_name(CHECKSUM_NAME, 1)
        row = [int(v) for v in rows[0]] if rows and rows[0] else []
        return {"on": len(row) > 2 and row[2] == 1, "hits": row[1] if len(row) > 1 else 0}

    def share_params(self, names: list[str]) -> dict | None:
        """transport="direct": the engine moves the parameters holding `names` into shared memory (in place, once)
        and answers {"token", "entries"}: [name, shm file, storage bytes, byte offset, dtype, shape, strides] for
        each it holds as a slice of one parameter (labkit.engine.inside.direct), and the token a later sync asks
        `shared_still` with; None when its model does not answer (not one of labkit's). The request and the
        answer are files in /dev/shm: trainer and engine share a node on this transport."""
        root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="labkit_direct_", suffix=".json", dir=root)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(list(names), f)
            if self._b.get_weights_by_name(SHARE_PREFIX + path, 1) is None:
                return None
            with open(path + ".out") as f:
                return json.load(f)
        finally:
            for p in (path, path + ".out"):
                if os.path.exists(p):
                    os.remove(p)

    def shared_still(self, token: str) -> bool:
        """Whether the engine's share answer `token` still holds (same parameters on the same shared storage):
        one short round trip instead of asking `share_params` in full every sync."""
        rows = self._b.get_weights_by_name(SHARE_PREFIX + AGAIN + token, 1)
        return bool(rows and rows[0] and int(rows[0][0]) == 1)

    def routes_flat(self) -> bool:
        """Whether the engine's model hands labkit payloads in `load_weights` to labkit's loader (labkit's own
        models answer the loader's stats name; SGLang's answer None). Asked once."""
        if self._routes is None:
            from labkit.engine.inside.apply import STATS_NAME

            self._routes = self._b.get_weights_by_name(STATS_NAME, 1) is not None
        return self._routes


def payload_items(names: list[str], shapes: list[list[int]]) -> list[tuple[str, tuple]]:
    """(name, shape) of what a distributed call carries: the tensors themselves, or those a labkit payload
    (one uint8 tensor named by its bucket's layout) stands for."""
    from labkit.engine.inside import apply  # torch

    if names and apply.routes([(names[0], None)]):
        return [x for n in names for x in apply.layout_of(n)]
    return [(n, tuple(s)) for n, s in zip(names, shapes)]
