"""`labkit faults`: randomized fault injection at random points of real syncs (Megatron trainer -> SGLang).

Each trial trains one step (so the new version differs from the served one), records the engine's checksums
(old) and those of what the trainer is about to send (new), arms one fault at one point of the sync
(labkit.sync.failpoints), runs an atomic sync (labkit.sync.atomic) and then checks, before anything else
talks to the engine, that it serves exactly old or new (`half_updated` counts engines that serve neither),
that its weight_version names what it serves, that it refused to generate while the fault held the sync
mid-way, and that a clean sync right after lands verified. Whatever a fault killed (trainer, engine) is
restarted; one trainer and one engine are reused across the trials that kill neither.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from labkit.config import ModelSpec, check

KINDS = ("exception", "trainer_killed", "engine_killed", "peer_hang", "port_in_use", "bad_tensor")
# --quick (tests): the kinds that restart nothing; tests/integration/test_faults.py covers kills and hangs.
QUICK_KINDS = ("exception", "port_in_use", "bad_tensor")
SYNC_POINTS = ("sync.begin", "sync.bucket", "sync.end", "sync.version")
SPEC = ModelSpec(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seed=0)


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultsConfig:
    trials: int = 20
    seed: int = 0
    quick: bool = False  # only faults that restart nothing (tests)
    bucket_mb: float = 0.05  # small buckets: many points inside one sync of the tiny model
    timeout_s: float = 6.0  # any single wait of a sync
    deadline_s: float = 15.0  # a whole sync (the tiny model takes 1-5 s on 2 loaded cores); finds a hung peer
    progress: bool = True

    def __post_init__(self) -> None:
        for f in ("trials", "seed"):
            v = getattr(self, f)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= (f == "trials"), f, v,
                  "an integer >= 1" if f == "trials" else "an integer >= 0")
        for f in ("bucket_mb", "timeout_s", "deadline_s"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f, v, "a positive number")


@dataclass(frozen=True, slots=True)
class Trial:
    kind: str
    transport: str
    point: str | None  # failpoint (None: the fault is in the input, not in a place)
    frac: float  # where among the buckets, for sync.bucket / transport.send (resolved once the plan is known)


def plan_trials(n: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[Trial]:
    """Kinds in shuffled rounds (every kind equally often), each with its own random point and transport."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        for kind in rng.sample(list(kinds), len(kinds)):
            if kind in ("peer_hang", "port_in_use"):
                transport = "distributed"
            else:
                transport = rng.choice(["per-tensor", "colocated", "distributed"])
            points = {"bad_tensor": [None], "port_in_use": ["transport.open"], "peer_hang": ["transport.send"]}.get(
                kind, list(SYNC_POINTS) + (["transport.send"] if transport == "distributed" else []))
            out.append(Trial(kind, transport, rng.choice(points), round(rng.random(), 3)))
    return out[:n]


class _Killer(threading.Thread):
    """Waits for a `wait` failpoint's marker, probes the engine (it must refuse to generate mid-sync), kills
    the target with ray.kill, then opens the gate."""

    def __init__(self, marker: str, gate: str, engine, target, limit_s: float):
        super().__init__(daemon=True)
        self.marker, self.gate, self.engine, self.target, self.limit_s = marker, gate, engine, target, limit_s
        self.served = None

    def run(self) -> None:
        import ray

        deadline = time.monotonic() + self.limit_s
        while not os.path.exists(self.marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(self.marker):
            try:
                self.engine.portable(call_timeout_s=10).generate(input_ids=[[5, 6, 7]],
                                                                sampling={"max_new_tokens": 1})
                self.served = True
            except Exception:
                self.served = False
            ray.kill(self.target, no_restart=True)
            time.sleep(0.5)  # let the death be seen before the trainer moves on
        Path(self.gate).unlink(missing_ok=True)


class Harness:
    def __init__(self, cfg: FaultsConfig, workdir: str):
        from labkit.models.tiny import make_tiny_mimo
        from labkit.sync import engine_spec
        from labkit.workbench import Workbench

        self.cfg, self.workdir = cfg, workdir
        self.wb = Workbench(str(make_tiny_mimo(Path(workdir) / "tiny", SPEC)))
        self.spec = engine_spec(self.wb.model_dir, self.wb.engine.cfg.dtype)
        self.restarts = Counter()

    def close(self) -> None:
        self.wb.close()

    def _restart_trainer(self) -> None:
        from labkit.trainer.group import Trainer

        self.wb.trainer.shutdown()
        self.wb.trainer = Trainer(self.wb.model_dir, self.wb.parallel, placement=self.wb.placement)
        self.restarts["trainer"] += 1

    def _about_to_send(self, scfg) -> tuple[dict, int]:
        """Checksums of what the trainer would send now (engine layout and dtype), and its bucket count."""
        from labkit.sync import bucket as bk
        from labkit.sync import verify as vf
        from labkit.sync.session import make_plan, metas_of

        named = self.wb.trainer.export()
        dt = bk.torch_dtype(self.spec["dtype"])
        plan = make_plan(metas_of(named), scfg, self.spec["dtype"])
        return vf.expected_checksums({n: t.to(dt) for n, t in named}), len(plan.buckets)

    def trial(self, i: int, t: Trial) -> dict:
        from labkit.sync import SyncConfig
        from labkit.sync import failpoints as fpt
        from labkit.sync.atomic import SyncFailed, guard_for

        wb, cfg = self.wb, self.cfg
        wb.train(1, batch_size=8, progress=False)
        engine, guard = wb.engine, guard_for(wb.engine)
        scfg = SyncConfig(transport=t.transport, bucket_mb=cfg.bucket_mb, progress=False, timeout_s=cfg.timeout_s,
                          deadline_s=cfg.deadline_s)
        new, n_buckets = self._about_to_send(scfg)
        old, v_old = engine.checksums(), engine.weight_version
        spec, killer, version, tmp = self.spec, None, f"t{i}", None
        if t.kind == "bad_tensor":
            spec = _bad_spec(self.spec, random.Random(i))
        elif t.point is not None:
            nth = 1 + int(t.frac * n_buckets) if t.point in ("sync.bucket", "transport.send") else 1
            nth = min(nth, n_buckets)
            action = {"exception": "raise", "peer_hang": "hang", "port_in_use": "squat"}.get(t.kind, "wait")
            kw = {}
            if action in ("wait", "hang"):
                tmp = tempfile.mkdtemp(prefix="labkit_fault_")
                kw = {"marker": f"{tmp}/reached", "gate": f"{tmp}/gate", "limit_s": cfg.deadline_s * 4}
                Path(kw["gate"]).touch()
            fpt.arm_in_actor(wb.trainer.actors[0], t.point, action, nth, **kw)
            if action == "wait":
                target = wb.trainer.actors[0] if t.kind == "trainer_killed" else engine._actor
                killer = _Killer(kw["marker"], kw["gate"], engine, target, cfg.deadline_s)
                killer.start()
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
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        trainer_alive = _alive(wb.trainer)
        if trainer_alive:
            fpt.disarm_in_actor(wb.trainer.actors[0])
        else:
            self._restart_trainer()
        if m.get("sync/engine_restarted"):
            self.restarts["engine"] += 1
        # The engine serves again now: it must hold exactly old or new, and say which.
        after, v_after = engine.checksums(), engine.weight_version
        state = "old" if after == old else "new" if after == new else "neither"
        version_ok = (state == "old" and v_after == v_old) or (state == "new" and v_after == version)
        try:
            engine.generate(input_ids=[[5, 6, 7]], sampling={"max_new_tokens": 2, "temperature": 0})
            serving = True
        except Exception:
            serving = False
        try:  # the next sync must land without restarting the driver
            nxt = guard.sync(wb.trainer, SyncConfig(transport=t.transport, bucket_mb=cfg.bucket_mb, progress=False,
                                                    timeout_s=cfg.timeout_s, deadline_s=cfg.deadline_s), self.spec)
        except SyncFailed as e:
            nxt = {"sync/verified": False, "sync/error": str(e)}
        # half-updated = serving weights that are neither version; a paused engine serves nothing
        ok = state != "neither" and version_ok and serving and nxt["sync/verified"] is True
        return {"kind": t.kind, "transport": t.transport, "point": t.point, "nth_of": n_buckets,
                "state": state, "serving": serving, "failed": err is not None, "restored": bool(m.get("sync/restored")),
                "recovered": ok, "version_ok": version_ok, "served_mid_sync": killer.served if killer else None,
                "recover_s": m.get("timing/sync/restore", 0.0), "sync_s": round(took, 3),
                "engine_restarted": bool(m.get("sync/engine_restarted")), "trainer_killed": not trainer_alive,
                "next_sync_verified": nxt["sync/verified"], "error": m.get("sync/error")}


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


def _alive(trainer) -> bool:
    import ray

    try:
        ray.get([a.address.remote() for a in trainer.actors], timeout=30)
        return bool(trainer.actors)
    except ray.exceptions.RayError:
        return False


def run(cfg: FaultsConfig | None = None) -> dict:
    from tqdm.auto import tqdm

    cfg = cfg or FaultsConfig()
    kinds = QUICK_KINDS if cfg.quick else KINDS
    trials = plan_trials(cfg.trials, cfg.seed, kinds)
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


def summarize(rows: list[dict], cfg: FaultsConfig, wall_s: float, restarts: dict) -> dict:
    per_kind = {}
    for k in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == k]
        per_kind[k] = {"trials": len(rs), "recovered": sum(r["recovered"] for r in rs),
                       "landed_new": sum(r["state"] == "new" for r in rs),
                       "kept_old": sum(r["state"] == "old" for r in rs),
                       "recover_s_max": round(max(r["recover_s"] for r in rs), 3)}
    rec = [r["recover_s"] for r in rows if r["restored"]]
    probes = [r["served_mid_sync"] for r in rows if r["served_mid_sync"] is not None]
    return {
        "faults/trials": len(rows),
        "faults/half_updated": sum(r["state"] == "neither" and r["serving"] for r in rows),
        "faults/not_serving": sum(not r["serving"] for r in rows),
        "faults/recovered": sum(r["recovered"] for r in rows),
        "faults/kinds": dict(Counter(r["kind"] for r in rows)),
        "faults/points": dict(Counter(r["point"] or "input" for r in rows)),
        "faults/transports": dict(Counter(r["transport"] for r in rows)),
        "faults/per_kind": per_kind,
        "faults/outcomes": dict(Counter(r["state"] for r in rows)),
        "faults/wrong_version": sum(not r["version_ok"] for r in rows),
        "faults/served_mid_sync": sum(bool(p) for p in probes),
        "faults/mid_sync_probes": len(probes),
        "faults/next_sync_verified": sum(r["next_sync_verified"] is True for r in rows),
        "faults/engine_restarts": restarts.get("engine", 0),
        "faults/trainer_restarts": restarts.get("trainer", 0),
        "faults/recover_s_mean": round(sum(rec) / len(rec), 3) if rec else 0.0,
        "faults/recover_s_max": round(max(rec), 3) if rec else 0.0,
        "faults/wall_s": round(wall_s, 1),
        "faults/seed": cfg.seed,
        "faults/rows": rows,
    }
