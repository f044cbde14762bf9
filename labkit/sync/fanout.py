"""One trainer, several engines, one weight version: every bucket goes out once to all of them (verl and slime sync many
rollout replicas this way), each engine is verified, and a failed engine is fenced without holding up the others.

Flow of `Replicas.sync` (driver side):
1. prepare: every engine not fenced must serve the same last good weights (one host copy for all of them,
   `lastgood.Store`, shared by one `Guard` per engine); pause generation on each;
2. one Syncer run into an `EngineGroup` of the engines (a handle that sends every call to every member at once): the
   distributed transport builds ONE weight-update group of the trainer and every engine's TP ranks (rank offsets 1,
   1+tp_0, ...) and broadcasts each bucket once; colocated hands every engine the same shared-memory handle;
3. verify each: engine 0 through the Syncer's own verification, every other engine's checksums against engine 0's; the
   host copy is promoted, generation continues;
4. on failure: each engine that still answers is restored to the last good weights by its guard (the atomic protocol,
   labkit.sync.atomic); one that does not is fenced (no traffic, never restarted here: a restart costs a model load the
   other engines would wait for; `revive(i)` brings it back). The engines still live retry the same version once, so one
   dead replica costs the others a retry, not the version. An engine that landed but fails its own verification is
   restored to the new version from the host copy.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from labkit.cluster.placement import cross_node
from labkit.engine.errors import EngineError, EngineUnreachable
from labkit.sync import lastgood
from labkit.sync.atomic import Guard, SyncFailed
from labkit.sync.producer import Producer
from labkit.sync.session import Syncer
from labkit.sync.spec import checked_expected
from labkit.sync.verify import ENGINE_CHECKSUMS
from labkit.trainer.group import error_line


class EngineGroup:
    """Several portable engine handles as one (what the Syncer and the transports call). Picklable: it crosses to
    the trainer rank that runs the sync. Each member's seconds inside calls are kept (`fanout_metrics`)."""

    def __init__(self, members: list, ids: list[int] | None = None):
        self.members, self.seconds = list(members), [0.0] * len(members)
        self.ids = list(range(len(members))) if ids is None else list(ids)  # the engines' indices, for metrics
        self.unreachable: set[int] = set()  # members that did not answer a call: not asked again by this group

    def _all(self, method: str, *args, per_member=None, **kwargs) -> list:
        """`method` on every member at once; every member's answer, or the first member's error once all ended.

        A member that did not answer (EngineUnreachable: dead, or its call timed out) is not asked again: the
        calls that follow a failure (closing the session, the group) would each wait out its timeout in turn,
        and a hung engine held the whole sync until its deadline killed the trainer. The others still get them."""
        def call(i):
            if i in self.unreachable:
                raise EngineUnreachable(f"engine {self.ids[i]} did not answer an earlier call of this sync ({method} "
                                        "not sent)")
            t0 = time.perf_counter()
            try:
                kw = {**kwargs, **(per_member(i) if per_member else {})}
                return getattr(self.members[i], method)(*args, **kw)
            except EngineUnreachable:
                self.unreachable.add(i)
                raise
            finally:
                self.seconds[i] += time.perf_counter() - t0

        with ThreadPoolExecutor(len(self.members), thread_name_prefix="labkit-fanout") as pool:
            futures = [pool.submit(call, i) for i in range(len(self.members))]
        return [f.result() for f in futures]

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *a, **k: self._all(method, *a, **k)[0]

    @property
    def tp_size(self) -> int:
        return sum(m.tp_size for m in self.members)

    @property
    def device(self) -> str:
        return self.members[0].device

    @property
    def call_timeout_s(self) -> float:
        return min(m.call_timeout_s for m in self.members)

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size, group_name, backend):
        offsets = [rank_offset + sum(m.tp_size for m in self.members[:i]) for i in range(len(self.members))]
        return self._all("init_weights_update_group", master_address=master_address, master_port=master_port,
                         world_size=world_size, group_name=group_name, backend=backend,
                         per_member=lambda i: {"rank_offset": offsets[i]})[0]

    def node(self) -> dict:
        """One place when no member is known to run on another node than the others, else "several" (a transport
        that hands over a shared-memory handle is then refused). An HTTP server has no Ray node id, only its URL's
        host: it is on another node than a Ray actor only where two routable addresses say so
        (labkit.cluster.placement.cross_node), as for a single server."""
        nodes = [m.node() for m in self.members]
        if any(cross_node(a, b) for a in nodes for b in nodes):
            return {"node_id": "several", "node_ip": nodes[0].get("node_ip")}
        return next((n for n in nodes if n.get("node_id")), nodes[0])

    def checksums(self) -> dict:
        """The first member's (the Syncer verifies one engine; `Replicas` compares every other with it)."""
        return self.members[0].checksums()

    def get_weights_by_name(self, name: str, truncate_size: int | None = None):
        return self.members[0].get_weights_by_name(name, truncate_size)

    def accepts(self, load_format: str) -> bool:
        return all(m.accepts(load_format) for m in self.members)

    def routes_flat(self) -> bool:
        return all(m.routes_flat() for m in self.members)

    def apply_path(self) -> str:
        paths = set(self._all("apply_path"))  # every member's loader stats are read (and reset)
        return paths.pop() if len(paths) == 1 else "mixed"

    @property
    def weight_version(self):
        raise ValueError("delta sync into several engines is not supported: sync with SyncConfig.delta=0")

    def fanout_metrics(self) -> dict:
        return {f"timing/sync/engine/{i}/calls": round(s, 6) for i, s in zip(self.ids, self.seconds)}


class Replicas:
    """Engines that serve the same weights and are synced together. `sync(producer, cfg)` -> metrics; the engines
    are EngineHandles (started by the caller, who also shuts them down); `fenced` holds the indices cut off."""

    def __init__(self, engines: list):
        if len(engines) < 1 or len({id(e) for e in engines}) != len(engines):
            raise ValueError(f"engines={engines!r} is invalid: expected one or more distinct engine handles")
        self.engines, self.fenced, self.store = list(engines), set(), lastgood.Store()
        self.guards = [Guard(e, store=self.store) for e in self.engines]
        self.synced = 0

    @property
    def live(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self.fenced]

    def sync(self, producer: Producer, cfg, weight_version: str | None = None) -> dict:
        """One weight version into every live engine (see the module's flow). Raises SyncFailed when no engine
        took it; else the metrics say which did (`sync/engines_synced`) and which are fenced."""
        if cfg.delta:
            raise ValueError(f"SyncConfig.delta={cfg.delta}: delta sync into several engines is not supported")
        if cfg.transport == "direct" and len(self.engines) > 1:  # it would write engine 0's parameters only
            raise ValueError(f"transport='direct' writes into one engine's own parameters, not {len(self.engines)} "
                             "engines: sync replicas with 'colocated' or 'distributed'")
        t0, version = time.perf_counter(), weight_version or f"v{self.synced + 1}"
        spec = checked_expected(self.engines[0], ())
        attempts, errors = 0, []
        while self.live and attempts < 2:
            attempts += 1
            try:
                m = self._once(producer, cfg, spec, version)
                break
            except _Attempt as e:  # the engines that failed are fenced, the others restored: try them again
                errors.append(str(e))
        else:
            raise SyncFailed(f"sync to {version!r} reached no engine: {'; '.join(errors)}",
                             {"sync/restored": False, "sync/engines_fenced": sorted(self.fenced), "sync/error":
                              errors[-1] if errors else "every engine is fenced"})
        self.synced += 1
        m.update({"sync/engines": len(self.engines), "sync/engines_synced": self.live,
                  "sync/engines_fenced": sorted(self.fenced), "sync/attempts": attempts, "sync/errors": errors,
                  "timing/sync/total_replicas": round(time.perf_counter() - t0, 6)})
        return m

    def _once(self, producer: Producer, cfg, spec: dict, version: str) -> dict:
        dtype = spec.get("dtype", "float32")
        before, v_before = self._prepare(spec, dtype, cfg)
        live, staging = self.live, self.store.staging(cfg.stage_spare)
        group = EngineGroup([self.engines[i].portable(call_timeout_s=cfg.timeout_s) for i in live], ids=live)
        try:  # the pauses too: an engine that dies before its pause must not leave the ones paused before it so
            for i in live:
                self.engines[i].pause_generation(cfg.pause_mode)
            m = producer.export_to(Syncer(), group, replace(cfg, stage_dir=staging), spec, version,
                                   deadline_s=cfg.deadline_s)
            if m.get("sync/verified") is False:
                raise EngineError(f"verification failed on engine {live[0]}: {m['verify/mismatched'][:3]}")
        except BaseException as e:
            self.store.discard(staging)
            self._recover(live, before, v_before, dtype, cfg)
            if isinstance(e, ValueError):  # refused before a byte moved (bad input, placement): no retry helps
                raise SyncFailed(f"sync to {version!r} refused: {error_line(e)}; the engines serve {v_before!r}",
                                 {"sync/restored": True, "sync/error": error_line(e), "sync/weight_version": v_before,
                                  "sync/engines_fenced": sorted(self.fenced)}) from None
            raise _Attempt(f"{error_line(e)} (engines {live}; fenced now: {sorted(self.fenced)})") from e
        after = m.pop(ENGINE_CHECKSUMS, None) or self.engines[live[0]].checksums()
        self.store.promote(staging, version, after, dtype)
        for i in live:  # each engine's own checksums, not only the one the Syncer verified
            t1, ok = time.perf_counter(), self._matches(i, after)
            if not ok:  # landed wrong: push the new version from the host copy (the guard restores to it)
                try:
                    self._restore(i, after, version, dtype, cfg)
                except BaseException:  # left paused by its guard: fenced until revived
                    self.fenced.add(i)
            m[f"sync/engine/{i}/verified"] = ok
            m[f"timing/sync/engine/{i}/verify"] = round(time.perf_counter() - t1, 6)
            if i not in self.fenced:
                self.engines[i].continue_generation()
        return m

    def _prepare(self, spec: dict, dtype: str, cfg) -> tuple[dict, str]:
        """What the first engine that answers serves becomes the last good copy (kept from the last sync, or
        made from it); another engine that serves something else is brought to it; one that cannot be is fenced."""
        before = v_before = None
        for i in self.live:
            try:
                if before is None:
                    before, v_before = self.engines[i].checksums(), self.engines[i].weight_version
                    self.guards[i]._ensure_last_good(before, v_before, dtype, spec)
                elif not self._matches(i, before):
                    self._restore(i, before, v_before, dtype, cfg)
            except EngineError:
                if v_before is None or i == min(self.live):
                    before = v_before = None
                self.fenced.add(i)
        if before is None:
            raise _Attempt(f"no engine answers (fenced: {sorted(self.fenced)})")
        return before, v_before

    def _matches(self, i: int, checksums: dict) -> bool:
        try:
            return self.engines[i].checksums() == checksums
        except EngineError:
            return False

    def _recover(self, live: list[int], before: dict, v_before: str, dtype: str, cfg) -> None:
        """Each engine that still answers back to `before`; one that does not is fenced."""
        for i in live:
            if not self.healthy(i):
                self.fenced.add(i)
                continue
            try:
                self._restore(i, before, v_before, dtype, cfg)
            except BaseException:  # its guard leaves it paused: fenced until revived
                self.fenced.add(i)

    def _restore(self, i: int, checksums: dict, version: str, dtype: str, cfg) -> None:
        self.guards[i]._restore_into(self.engines[i].portable(call_timeout_s=cfg.timeout_s), checksums, version,
                                     dtype, restarted=False, pause_mode=cfg.pause_mode)

    def healthy(self, i: int) -> bool:
        """Engine `i` answers /health within 10 s."""
        try:
            return bool(self.engines[i].portable(call_timeout_s=10.0).health())
        except EngineError:
            return False

    def revive(self, i: int, timeout_s: float = 120.0, pause_mode: str = "abort") -> None:
        """Bring fenced engine `i` back: restart it if it died, load the last good weights, unfence it.
        `pause_mode`: how it pauses meanwhile (retract keeps requests it holds waiting, labkit.sync.atomic)."""
        good = self.store.good
        if good is None:
            raise EngineError("no last good weights yet: sync the replicas first")
        dtype = checked_expected(self.engines[0], ())["dtype"]
        self.guards[i].restore(good["checksums"], good["version"], dtype, timeout_s, pause_mode)
        self.fenced.discard(i)

    def close(self) -> None:
        self.store.close()


class _Attempt(Exception):
    """One attempt failed; the engines that failed are fenced and the others restored."""
