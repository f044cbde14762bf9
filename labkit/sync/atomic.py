"""Atomic weight updates: a sync lands completely, verified, with its new weight_version, or the engine is
brought back to the previous weights bitwise before it serves anything again.

Why this design (SGLang 0.5.23; the same on CPU and GPU):

- SGLang's weight-update session (begin/end_weight_update) only brackets the loads. It does not stop generation, and it
  has no rollback: a load that fails half-way leaves "the full weights ... partially updated" (SGLang's own message). So
  labkit closes a gate itself: `pause_generation` before the first byte (the Ray actor then refuses generate; an HTTP
  server holds requests) and `continue_generation` only once the engine's checksums equal the new version (verified) or
  the last good one (restored).
- Rollback needs the old bytes, from somewhere that survives the fault. Reading them back from the engine is slow and
  impossible once it died; a checkpoint on disk per step is slow. The syncer instead writes a host copy of every tensor
  as it sends it (labkit.sync.lastgood, tmpfs files: one memcpy per byte, `timing/sync/stage`), which becomes the last
  good version once the sync verified. Files, not the trainer's heap: the copy survives a killed trainer. Cost: two
  models in host memory, the last good copy and the superseded one kept as the next sync's staging files, which the
  syncer keeps mapped (a fresh file faults every page in: 0.11 s of the bench model's sync; `lastgood.Store`).
- The first sync has no copy yet: the engine's model dir is the last good version when its bytes hash to the engine's
  checksums (the usual case), else labkit reads the weights back from the engine once.
- On any failure: kill a trainer that missed the deadline or was interrupted (Ctrl-C) mid-sync (fencing: a late bucket
  from it could land inside the restore or the next session), restart an engine whose process died or stopped answering
  (from its model dir), close the session, push the last good copy in one session, tag its weight_version, and compare
  the engine's checksums with those taken before the sync. Only then continue generation. If that fails too, the engine
  stays paused and SyncFailed says so: it never serves weights labkit cannot name.

Who does what: the sync layer owns the guard (one per engine handle, in this module's table, closed through the handle's
`on_shutdown` hook). The tensors come from a *producer* (labkit.sync.producer), whose `export_to` hands its (name,
tensor) pairs to the consumer this guard passes, the `Syncer`: the `Trainer` (its ranks' export; it fences itself on the
deadline) or a local iterator (`labkit.sync.stream`). The guard never reaches into a producer's processes.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import replace

from labkit.engine import checksum as ck
from labkit.engine.errors import EngineError, EngineUnreachable
from labkit.sync import lastgood
from labkit.sync import probe
from labkit.sync import verify as vf
from labkit.sync.producer import Producer
from labkit.sync.session import Syncer
from labkit.sync.spec import sharding
from labkit.sync.verify import ENGINE_CHECKSUMS
from labkit.trainer.group import TrainerDied, TrainerTimeout, error_line as _cause

__all__ = ["Guard", "SyncFailed", "TrainerDied", "TrainerTimeout", "guard_for"]

RESTORE_CHUNK_BYTES = 64 << 20  # restore pushes this much per update call


class SyncFailed(RuntimeError):
    """The sync did not land. `.restored` says whether the engine serves the last good weights again;
    `.metrics` has what happened (cause, restore seconds, restarted engine, trainer alive)."""

    def __init__(self, message: str, metrics: dict):
        super().__init__(message)
        self.metrics = metrics
        self.restored = bool(metrics.get("sync/restored"))


_GUARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine handle -> its Guard


def guard_for(engine) -> Guard:
    """The engine's guard (made on first use): one last good copy per engine handle, whoever syncs into it.
    Kept here, not on the handle: the engine layer knows nothing of syncs; the handle's shutdown closes it
    through a hook it does not look into (the host copy is a model's worth of tmpfs, i.e. RAM)."""
    g = _GUARDS.get(engine)
    if g is None:
        g = _GUARDS[engine] = Guard(engine)
        engine.on_shutdown(g.close)
    return g


class Guard:
    """One per engine handle: the last good copy and the sync protocol around it."""

    def __init__(self, engine, root: str | None = None, store: lastgood.Store | None = None):
        """`store`: a last good copy shared with other guards (engines synced together, labkit.sync.fanout); its
        owner closes it. The engine is held weakly: the table above is keyed by it, and a value holding its key
        would keep every handle (and its host copy) alive for good."""
        self._engine, self.synced, self._owns = weakref.ref(engine), 0, store is None
        self.store = lastgood.Store(root) if store is None else store
        self.modified = False  # the last restore found the engine's weights changed by the failed sync

    @property
    def engine(self):
        if (engine := self._engine()) is None:
            raise EngineError("the engine handle this guard belonged to is gone")
        return engine

    def close(self) -> None:
        if self._owns:
            self.store.close()
        engine = self._engine()
        if engine is not None and _GUARDS.get(engine) is self:
            del _GUARDS[engine]

    # --- the protocol --------------------------------------------------------------------------------------
    def sync(self, producer: Producer, cfg, spec: dict, weight_version: str | None = None,
             exclude: tuple = ()) -> dict:
        """Land `producer`'s tensors completely (verified, tagged `weight_version`) or restore the last good ones;
        SyncFailed (with `.restored` and `.metrics`) when the sync did not land. `producer`: the `Trainer`, or any
        `labkit.sync.producer.Producer` (`labkit.sync.stream` passes a local one)."""
        t0 = time.perf_counter()
        engine, dtype = self.engine, spec.get("dtype", "float32")
        # after a verified sync and generation only, the engine answers from its memo (labkit.engine.inside.checkmemo)
        try:
            before, v_before = engine.checksums(), engine.weight_version
        except EngineUnreachable:  # died since the last sync: bring back what it served, then go on
            if (good := self.store.good) is None:
                raise
            self.restore(good["checksums"], good["version"], dtype, cfg.timeout_s, cfg.pause_mode)
            before, v_before = engine.checksums(), engine.weight_version
        self._ensure_last_good(before, v_before, dtype, spec)
        version = weight_version or f"v{self.synced + 1}"
        staging = self.store.staging(cfg.stage_spare)
        t_guard = time.perf_counter() - t0
        try:
            engine.pause_generation(cfg.pause_mode)
            m = producer.export_to(Syncer(), engine.portable(call_timeout_s=cfg.timeout_s),
                                   replace(cfg, stage_dir=staging), spec, version, exclude=tuple(exclude),
                                   deadline_s=cfg.deadline_s)
            if m.get("sync/verified") is False:
                raise EngineError(f"verification failed: {len(m['verify/mismatched'])} tensors differ "
                                  f"(e.g. {m['verify/mismatched'][:3]}), {len(m['verify/missing'])} missing, "
                                  f"draft runner parameters unchecked: {m.get('verify/draft_unchecked', [])[:3]}")
            if cfg.probe:  # in behaviour: it generates, so the engine serves the verified weights from here on
                engine.continue_generation()
                m.update(probe.measure(producer, engine, cfg.probe, probe.vocab_of(spec)))
                if (why := probe.verdict(m, probe.limit(cfg.probe_kl_max, spec))) is not None:
                    raise EngineError(why)
        except BaseException as e:
            self.store.discard(staging)
            raise self._fail(e, before, v_before, version, dtype, time.perf_counter() - t0, cfg) from None
        t1 = time.perf_counter()
        after = m.pop(ENGINE_CHECKSUMS, None) or engine.checksums()  # verify's own read, if it made one
        self.store.promote(staging, version, after, dtype)
        if not cfg.probe:  # the probe continued it
            engine.continue_generation()
        self.synced += 1
        t2 = time.perf_counter()
        # verify="none" is refused by SyncConfig unless unsafe_skip_verify: say so wherever these weights are logged
        m.update({"sync/atomic": True, "sync/restored": False, "sync/unsafe_skip_verify": cfg.verify == "none",
                  "timing/sync/guard": round(t_guard + t2 - t1, 6), "timing/sync/total_guarded": round(t2 - t0, 6)})
        return m

    def _ensure_last_good(self, before: dict, v_before: str, dtype: str, spec: dict) -> None:
        """Make sure a host copy of what the engine serves now exists (the rollback target)."""
        if self.store.good is not None and self.store.good["checksums"] == before:
            return
        model_dir = self.engine.cfg.model_dir
        pad, algo, shards = spec.get("ffn_pad", 1), spec.get("checksum", ck.DEFAULT), sharding(spec)
        if vf.with_draft(vf.expected_checksums(lastgood.model_dir_tensors(model_dir, dtype), pad, algo, shards),
                         before) == before:
            self.store.adopt_model_dir(model_dir, v_before, before)
            return
        # Someone changed the weights outside labkit's syncs: read them back once (slow, but exact).
        named = {n: self.engine.get_weights_by_name(n).to(lastgood.bk.torch_dtype(held))
                 for n, (_, held) in spec["tensors"].items()}  # the read-back is float32: back to what is held
        if vf.with_draft(vf.expected_checksums(named, pad, algo, shards), before) != before:
            raise EngineError("cannot take a bitwise copy of the weights the engine serves now (its read-back "
                              "does not hash to its checksums): refusing to sync without a rollback target")
        path = lastgood.write(self.store.staging(), named, v_before)
        self.store.promote(path, v_before, before, dtype)

    def _fail(self, err: BaseException, before: dict, v_before: str, version: str, dtype: str, took: float,
              cfg) -> SyncFailed:
        t0 = time.perf_counter()
        cause = _cause(err)
        m = {"sync/atomic": True, "sync/weight_version_attempted": version, "sync/error": cause,
             "sync/trainer_alive": not isinstance(err, (TrainerDied, KeyboardInterrupt)),  # Ctrl-C: fenced, as if hung
             "sync/engine_restarted": False, "timing/sync/failed_after": round(took, 6)}
        try:
            restarted = self.restore(before, v_before, dtype, cfg.timeout_s, cfg.pause_mode)
            m.update({"sync/restored": True, "sync/engine_restarted": restarted,
                      "sync/modified_before_restore": self.modified, "sync/weight_version": v_before})
            state = (f"the engine serves {v_before!r} again (bitwise, {len(before)} tensors checked)"
                     + (" after a restart from its model dir" if restarted else ""))
        except BaseException as e2:  # the gate stays closed: generate is refused until a restore succeeds
            m.update({"sync/restored": False, "sync/restore_error": _cause(e2)})
            state = f"restoring the last good weights failed too ({_cause(e2)}); the engine stays PAUSED"
        m["timing/sync/restore"] = round(time.perf_counter() - t0, 6)
        hint = "; the trainer is gone: start a new one" if not m["sync/trainer_alive"] else ""
        return SyncFailed(f"sync to {version!r} failed: {cause}; {state}{hint}", m)

    def restore(self, before: dict, v_before: str, dtype: str, timeout_s: float, pause_mode: str = "abort") -> bool:
        """Bring the engine back to the weights whose checksums are `before`; True if it was restarted.
        `pause_mode`: the failed sync's (SyncConfig.pause_mode), kept while restoring (see `_restore_into`)."""
        bounded = self.engine.portable(call_timeout_s=timeout_s)
        try:
            alive = bounded.health()
        except EngineError:
            alive = False
        if alive:
            try:
                self._restore_into(bounded, before, v_before, dtype, restarted=False, pause_mode=pause_mode)
                return False
            except EngineUnreachable:  # answers /health but not the calls that matter: wedged
                pass
        # Dead, or wedged behind a call that never returns: only a new process helps.
        self.engine.restart()
        self._restore_into(self.engine, before, v_before, dtype, restarted=True)
        return True

    def _restore_into(self, engine, before: dict, v_before: str, dtype: str, restarted: bool,
                      pause_mode: str = "abort") -> None:
        # Paused in the failed sync's mode: under "retract" the requests the sync moved back to the waiting queue
        # wait for the restored weights; an "abort" pause here would refuse every one of them.
        engine.pause_generation(pause_mode)
        if not restarted:
            for step in (engine.end_weight_update, lambda: engine.destroy_weights_update_group(
                    "labkit_weight_update")):
                try:  # an open session or a half-built group left by the failed sync; absent is fine
                    step()
                except EngineUnreachable:
                    raise
                except EngineError:
                    pass
        # Did the failed sync change the live engine's weights? (`labkit faults` counts these: it proves a
        # fault really hit weights; a restarted engine comes back from its model dir and is not counted.)
        changed = engine.checksums() != before
        self.modified = changed and not restarted
        if changed:
            self._push(engine, self.store.tensors(dtype))
        engine.set_weight_version(v_before)
        now = engine.checksums()
        if now != before:
            bad = sorted(n for n in before if now.get(n) != before[n])
            raise EngineError(f"restored weights differ from the last good ones: {bad[:3]}")
        self.engine.continue_generation()

    @staticmethod
    def _push(engine, named: dict) -> None:
        engine.begin_weight_update()
        try:
            chunk, size = [], 0
            for n, t in named.items():
                chunk.append((n, t))
                size += t.numel() * t.element_size()
                if size >= RESTORE_CHUNK_BYTES:
                    engine.update_weights_from_tensor(chunk, flush_cache=False)
                    chunk, size = [], 0
            if chunk:
                engine.update_weights_from_tensor(chunk, flush_cache=False)
        finally:
            engine.end_weight_update()
        engine.flush_cache()  # no KV computed from the failed version's weights may be reused
