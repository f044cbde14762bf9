"""The harness behind `labkit faults` (`run`; the kinds, plan and summary are in labkit.lab.faults.plan): one
Workbench, one trial at a time.

A trial arms one fault (a trainer-side failpoint through Ray's `__ray_call__`, an engine-side one in the
engine actor, which its SGLang scheduler reads), runs an atomic sync, then reads the engine back before anything
else talks to it. Whatever a fault killed (trainer, engine) is restarted; one trainer and one engine are reused
across the trials that kill neither.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from labkit import failpoints as fpt
from labkit.models.tiny import make_tiny_mimo
from labkit.sync import SyncConfig, engine_spec
from labkit.sync import bucket as bk
from labkit.sync import verify as vf
from labkit.sync.atomic import SyncFailed, guard_for
from labkit.sync.plan import make_plan, metas_of
from labkit.trainer.group import Trainer
from labkit.workbench.core import Workbench
from labkit.lab.faults.plan import KINDS, QUICK_KINDS, SPEC, FaultsConfig, Trial, plan_trials, summarize

DELTA_EVERY = 8  # a delta trial's anchor interval: its faulted sync is the first after the anchor
PROBE_S = 2.0  # the sync stays held at least this long (or until the probe is answered or refused)

def run(cfg: FaultsConfig | None = None) -> dict:
    from tqdm.auto import tqdm

    cfg = cfg or FaultsConfig()
    trials = plan_trials(cfg.trials, cfg.seed, QUICK_KINDS if cfg.quick else KINDS)
    t0, workdir = time.perf_counter(), tempfile.mkdtemp(prefix="labkit_faults_")
    rows = []
    try:
        h = Harness(cfg, workdir)
        try:
            bar = tqdm(trials, desc="faults", unit="trial", disable=not cfg.progress)
            for i, t in enumerate(bar):
                bar.set_postfix_str(f"{t.kind}@{t.point or 'input'}/{t.transport}")
                rows.append(h.trial(i, t))
            restarts = dict(h.restarts)
        finally:
            h.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return summarize(rows, cfg, time.perf_counter() - t0, restarts)


class Killer(threading.Thread):
    """Waits for a `wait` failpoint's marker, probes the engine (no answer may come back while the sync is held
    mid-way: a refusal or a request held until the sync ends are both right), kills `target` with ray.kill
    (None: probe only), then opens the gate.

    `served` is decided by time, over the whole hold: the probe answered before the gate opened. A probe still
    pending when the gate opens was held by the engine, which is right, whenever it is answered after that.
    `killed`: ray.kill was called on `target` (a killer whose marker never appeared kills nothing)."""

    def __init__(self, marker: str, gate: str, engine, target, limit_s: float):
        super().__init__(daemon=True)
        self.marker, self.gate, self.engine, self.target, self.limit_s = marker, gate, engine, target, limit_s
        self.answered_at = self.released_at = None
        self.killed = False
        self._done = threading.Event()

    @property
    def served(self) -> bool | None:
        if self.released_at is None:
            return None  # the sync was never held here
        return self.answered_at is not None and self.answered_at < self.released_at

    def run(self) -> None:
        import ray

        deadline = time.monotonic() + self.limit_s
        while not os.path.exists(self.marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(self.marker):
            threading.Thread(target=self._ask, daemon=True).start()
            self._done.wait(PROBE_S)
            # The hold ends here: a kill ends the sync as surely as the open gate (the guard then restores and
            # serves), so an answer after this instant was not served mid-sync.
            self.released_at = time.monotonic()
            if self.target is not None:
                ray.kill(self.target, no_restart=True)
                self.killed = True
                time.sleep(0.5)  # let the death be seen before the trainer moves on
        Path(self.gate).unlink(missing_ok=True)

    def _ask(self) -> None:
        try:
            self.engine.portable(call_timeout_s=60).generate(input_ids=[[5, 6, 7]], sampling={"max_new_tokens": 1})
            self.answered_at = time.monotonic()
        except Exception:
            pass  # refused (or cut off by the fault): nothing served
        self._done.set()


def about_to_send(trainer, spec: dict, scfg) -> tuple[dict, int, int]:
    """Checksums of what `trainer` would send now (the engines' layout and dtype, `spec`), its bucket count, and
    how many fused q/k/v groups it holds (where an engine-side fault can land)."""
    named = trainer.export()
    dt = bk.torch_dtype(spec["dtype"])
    plan = make_plan(metas_of(named), scfg, spec["dtype"])
    n_groups = sum(".k_proj." in n for n, _ in named)
    return vf.expected_checksums({n: t.to(dt) for n, t in named}), len(plan.buckets), n_groups


def arm_fault(t: Trial, trainer_actor, engine, n_buckets: int, n_groups: int, tmp: str,
              deadline_s: float) -> Killer | None:
    """Arm trial `t`'s fault: a trainer-side failpoint in `trainer_actor`, an engine-side one in `engine`'s actor
    (which its SGLang scheduler reads). The marker (`{tmp}/fault_reached`) is written where the fault fires, in
    whatever process that is. A `wait` fault gets its Killer (started): it kills the trainer rank, or the engine's
    actor for `engine_killed`, once the point is reached."""
    wait = {"marker": f"{tmp}/fault_reached", "gate": f"{tmp}/fault_gate", "limit_s": deadline_s * 4}
    Path(wait["gate"]).touch()  # a hang's gate is never opened by the harness: the sync's deadline ends it
    if t.point == "engine.apply":  # before the k of the nth fused group: its q is written already
        nth = min(1 + int(t.frac * n_groups), n_groups)
        fpt.arm_in_actor(engine._actor, t.point, t.action, nth, match=".k_proj.", limit_s=deadline_s * 4,
                         marker=wait["marker"])
    else:
        per_bucket = t.point in ("sync.bucket", "transport.send", "bucket.pack")
        nth = min(1 + int(t.frac * n_buckets), n_buckets) if per_bucket else 1
        kw = wait if t.action in ("wait", "hang") else {"marker": wait["marker"]}
        fpt.arm_in_actor(trainer_actor, t.point, t.action, nth, **kw)
    if t.action != "wait":
        return None
    target = engine._actor if t.kind == "engine_killed" else trainer_actor
    killer = Killer(wait["marker"], wait["gate"], engine, target, deadline_s)
    killer.start()
    return killer


class Harness:
    def __init__(self, cfg: FaultsConfig, workdir: str):
        self.cfg, self.workdir = cfg, workdir
        self.wb = Workbench(str(make_tiny_mimo(Path(workdir) / "tiny", SPEC)))
        self.spec = engine_spec(self.wb.model_dir, self.wb.engine.cfg.dtype)
        self.restarts = Counter()

    def close(self) -> None:
        self.wb.close()

    def _restart_trainer(self) -> None:
        self.wb.trainer.shutdown()
        self.wb.trainer = Trainer(self.wb.model_dir, self.wb.parallel, placement=self.wb.placement)
        self.restarts["trainer"] += 1

    def _about_to_send(self, scfg) -> tuple[dict, int, int]:
        return about_to_send(self.wb.trainer, self.spec, scfg)

    def _arm(self, t: Trial, n_buckets: int, n_groups: int, tmp: str) -> Killer | None:
        """Arm the trial's fault, and a probe at sync.begin where the fault itself holds nothing."""
        trainer0 = self.wb.trainer.actors[0]
        killer = arm_fault(t, trainer0, self.wb.engine, n_buckets, n_groups, tmp, self.cfg.deadline_s)
        if killer is not None or t.point == "sync.begin":
            return killer
        probe = {"marker": f"{tmp}/probe_reached", "gate": f"{tmp}/probe_gate", "limit_s": self.cfg.deadline_s * 4}
        Path(probe["gate"]).touch()
        fpt.arm_in_actor(trainer0, "sync.begin", "wait", 1, **probe)
        killer = Killer(probe["marker"], probe["gate"], self.wb.engine, None, self.cfg.deadline_s)
        killer.start()
        return killer

    def trial(self, i: int, t: Trial) -> dict:
        wb, cfg = self.wb, self.cfg
        wb.train(1, batch_size=8, progress=False)
        engine, guard = wb.engine, guard_for(wb.engine)
        scfg = SyncConfig(transport=t.transport, bucket_mb=cfg.bucket_mb, progress=False, timeout_s=cfg.timeout_s,
                          deadline_s=cfg.deadline_s, delta=DELTA_EVERY if t.delta else 0)
        new, n_buckets, n_groups = self._about_to_send(scfg)
        old, v_old = engine.checksums(), engine.weight_version
        spec, killer, version = self.spec, None, f"t{i}"
        tmp = tempfile.mkdtemp(prefix="labkit_fault_")
        if t.delta:  # an anchor first, so the faulted sync carries delta payloads
            guard.sync(wb.trainer, scfg, self.spec)
            wb.train(1, batch_size=8, progress=False)
            new = self._about_to_send(scfg)[0]
            old, v_old = engine.checksums(), engine.weight_version
        if t.kind == "bad_tensor":
            spec = _bad_spec(self.spec, random.Random(i))
        else:
            killer = self._arm(t, n_buckets, n_groups, tmp)
        t0, err, m = time.perf_counter(), None, {}
        try:
            m = guard.sync(wb.trainer, scfg, spec, version)
        except SyncFailed as e:
            err, m = e, e.metrics
        except Exception as e:  # not even a SyncFailed: recorded, and the engine is still checked below
            err, m = e, {"sync/error": f"{type(e).__name__}: {e}"}
        took = time.perf_counter() - t0
        if killer is not None:
            killer.join(timeout=cfg.deadline_s)
        fired = fault_fired(t, tmp, killer, err)
        shutil.rmtree(tmp, ignore_errors=True)
        trainer_alive = self._disarm(engine)
        if m.get("sync/engine_restarted"):
            self.restarts["engine"] += 1
        return {"kind": t.kind, "transport": t.transport, "delta": t.delta, "point": t.point, "nth_of": n_buckets,
                "fired": fired, "failed": err is not None, "sync_metrics": _scalars(m),
                "restored": bool(m.get("sync/restored")), "served_mid_sync": killer.served if killer else None,
                "recover_s": m.get("timing/sync/restore", 0.0), "sync_s": round(took, 3),
                "engine_restarted": bool(m.get("sync/engine_restarted")), "trainer_killed": not trainer_alive,
                "error": m.get("sync/error"),
                **self._check(engine, guard, t, old, v_old, new, version, m)}

    def _disarm(self, engine) -> bool:
        """Disarm trainer and engine; restart a trainer the fault killed. True if the trainer had survived."""
        alive = trainer_answers(self.wb.trainer)
        if alive:
            fpt.disarm_in_actor(self.wb.trainer.actors[0])
        else:
            self._restart_trainer()
        try:
            fpt.disarm_in_actor(engine._actor, timeout_s=10)
        except Exception:  # the engine a fault killed is gone, and its arming with it
            pass
        return alive

    def _check(self, engine, guard, t: Trial, old, v_old, new, version, m: dict) -> dict:
        """What the engine serves now (before anything else talks to it), and whether the next sync lands."""
        cfg = self.cfg
        after, v_after = engine.checksums(), engine.weight_version
        state = "old" if after == old else "new" if after == new else "neither"
        version_ok = (state == "old" and v_after == v_old) or (state == "new" and v_after == version)
        try:
            engine.generate(input_ids=[[5, 6, 7]], sampling={"max_new_tokens": 2, "temperature": 0})
            serving = True
        except Exception:
            serving = False
        try:  # the next sync must land without restarting the driver
            nxt = guard.sync(self.wb.trainer, SyncConfig(transport=t.transport, bucket_mb=cfg.bucket_mb,
                                                         progress=False, timeout_s=cfg.timeout_s,
                                                         deadline_s=cfg.deadline_s), self.spec)
        except SyncFailed as e:
            nxt = {"sync/verified": False, "sync/error": str(e)}
        ok = state != "neither" and version_ok and serving and nxt["sync/verified"] is True
        return {"state": state, "serving": serving, "version_ok": version_ok, "recovered": ok,
                "next_sync_verified": nxt["sync/verified"],
                # the fault had changed the live engine's weights, and they were brought back bitwise
                "modified_then_restored": bool(m.get("sync/modified_before_restore")) and state == "old"}


def fault_fired(t: Trial, tmp: str, killer: Killer | None, err: Exception | None) -> bool:
    """Proof the trial's fault happened: its failpoint's marker was written where it fired (and, for a kill, the
    process was killed there); a bad tensor, the sync refused it."""
    if t.kind == "bad_tensor":
        return err is not None
    reached = os.path.exists(f"{tmp}/fault_reached")
    return reached and (killer.killed if t.action == "wait" else True)


def _scalars(m: dict) -> dict:
    """The faulted sync's own metrics, the scalar ones (what the row keeps for a reader to check)."""
    return {k: v for k, v in m.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _bad_spec(spec: dict, rng: random.Random) -> dict:
    """The engine's spec with one tensor renamed or reshaped: the trainer's tensors no longer fit."""
    tensors = dict(spec["tensors"])
    name = rng.choice(sorted(tensors))
    shape, dtype = tensors.pop(name)
    if rng.random() < 0.5:
        tensors[name + ".renamed"] = (shape, dtype)
    else:
        tensors[name] = ((shape[0] + 1, *shape[1:]), dtype)
    return {**spec, "tensors": tensors}


def trainer_answers(trainer) -> bool:
    import ray

    try:
        ray.get([a.__ray_ready__.remote() for a in trainer.actors], timeout=30)
        return bool(trainer.actors)
    except ray.exceptions.RayError:
        return False
