"""`labkit soak`: an RL run's worth of syncs into two engines that serve meanwhile, with faults, and everything a
leak or a drift would show in, sampled sync after sync (issue: "soak").

Flow of `Soak.step` (the whole loop is `run`):
1. train one step (the trainer's weights move away from the engines');
2. for a faulted sync: what the trainer is about to send (checksums, buckets, fused groups) and what each engine
   serves, then the fault armed (labkit.lab.faults.harness.arm_fault; engine faults land in the actor engine);
3. the HTTP engine's clients are let go, and one atomic sync into both engines runs under them
   (labkit.sync.fanout.Replicas: one send, each engine verified, a failed one fenced, the others restored);
4. after a fault: proof it fired, the trainer replaced if it was killed, each engine's state (old, new, or neither:
   half-updated), fenced engines revived;
5. the load settles: every response checked against its version's greedy output (labkit.lab.soak.serving);
6. every process under the driver, /dev/shm and Ray's object store sampled (labkit.lab.soak.resources); every
   `accept_every` syncs the served draft's acceptance, twice.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from labkit import failpoints as fpt
from labkit.cluster import allocator
from labkit.lab.bench.serve import paused_within
from labkit.lab.faults.harness import about_to_send, arm_fault, fault_fired, trainer_answers
from labkit.lab.soak import resources
from labkit.lab.soak.config import SoakConfig
from labkit.lab.soak.rowlog import RowLog
from labkit.lab.soak.schedule import Step, steps
from labkit.lab.soak.summary import summarize
from labkit.lab.soak.tracebacks import without_traceback

ACCEPT_PROMPTS = 16  # held-out problems the draft's acceptance is measured on
ENGINE_KINDS = ("engine_killed", "apply_crash", "apply_hang")  # faults that land in the actor engine: it must serve


class Soak:
    def __init__(self, cfg: SoakConfig):
        self.cfg, self.engines, self.trainer, self.replicas, self.load = cfg, [], None, None, None
        try:
            self._start()
        except BaseException:  # a half-started soak must not leave an engine or the trainer running
            self.close()
            raise

    def _start(self) -> None:
        from labkit.cluster import runtime
        from labkit.config import ParallelSpec, TrainConfig
        from labkit.engine import EngineConfig, EngineHandle
        from labkit.lab.soak.serving import Load  # the openai client: imported where it runs
        from labkit.models.tiny import default_model_dir
        from labkit.models.tokenizer import encode
        from labkit.sync import engine_spec
        from labkit.sync.fanout import Replicas
        from labkit.tasks import arith
        from labkit.trainer.group import Trainer

        cfg = self.cfg
        self.model = str(default_model_dir())  # the shipped tiny MiMo: its MTP draft was trained, so acceptance says
        ecfg = EngineConfig(model_dir=self.model, dtype="float32", max_total_tokens=4096, mem_fraction_static=0.05,
                            call_timeout_s=cfg.timeout_s)
        runtime.init()
        self.new_trainer = lambda: Trainer(self.model, ParallelSpec(), TrainConfig(lr=cfg.lr))
        # 0: an HTTP server under client load; 1: a Ray actor, where engine faults land. Both beside the trainer (as
        # labkit.engine.startup.start_beside); every engine that started is kept for close(), whatever failed.
        pool = ThreadPoolExecutor(2, thread_name_prefix="labkit-start")
        starts = [pool.submit(EngineHandle.launch, ecfg), pool.submit(EngineHandle.start, ecfg)]
        try:
            self.trainer = self.new_trainer()
        finally:
            pool.shutdown(wait=True)
            self.engines.extend(f.result() for f in starts if f.exception() is None)
        for f in starts:
            if f.exception() is not None:
                raise f.exception()
        self.replicas, self.spec = Replicas(self.engines), engine_spec(self.model, "float32")
        self.load = Load(self.engines[0], [encode(p.prompt) for p in arith.problems(cfg.prompts, seed=7)], cfg)
        self.eval_ids = [encode(p.prompt) for p in arith.evaluation(ACCEPT_PROMPTS)]
        self.restarts, self.reviving, self.revivals = {"trainer": 0}, {}, []
        self.threads = resources.thread_names()

    def close(self) -> None:
        for part in (self.load, self.replicas):
            if part is not None:
                part.close()
        for e in self.engines:
            e.shutdown()
        if self.trainer is not None:
            self.trainer.shutdown()

    def step(self, st: Step) -> dict:
        from labkit.sync import SyncConfig
        from labkit.sync.atomic import SyncFailed
        from labkit.workbench.core import train

        cfg, clock = self.cfg, [time.monotonic()]

        def lap() -> float:  # seconds since the last lap: where a step's time goes (soak/step_s)
            clock.append(time.monotonic())
            return round(clock[-1] - clock[-2], 3)

        self.revive_fenced(wait=st.fault is not None and st.fault.kind in ENGINE_KINDS)
        steps_s = {"revive_wait": lap()}
        train(self.trainer, 1, batch_size=8, seed=1 + st.index, progress=False)
        steps_s["train"] = lap()
        scfg = SyncConfig(transport=st.transport, bucket_mb=st.bucket_mb, progress=False, timeout_s=cfg.timeout_s,
                          deadline_s=cfg.deadline_s, pause_mode=cfg.pause_mode)
        armed = self._arm(st, scfg) if st.fault else None
        self.load.open()
        served, t0 = self.engines[0], time.monotonic()
        err, m = None, {}
        try:
            m = self.replicas.sync(self.trainer, scfg, f"s{st.index}")
        except SyncFailed as e:  # kept for its type and message only (labkit.lab.soak.tracebacks)
            err, m = without_traceback(e), e.metrics
        except Exception as e:  # noqa: BLE001 - not even a SyncFailed: recorded, the engines checked below
            err, m = without_traceback(e), {"sync/error": f"{type(e).__name__}: {e}"[:300]}
        t1 = time.monotonic()
        pause_s = paused_within(served.pauses, t0, t1)
        row = {"sync": st.index, "transport": st.transport, "bucket_mb": st.bucket_mb, "e2e_s": round(t1 - t0, 4),
               "pause_s": round(pause_s, 4), "failed": err is not None,
               "verified": m.get("sync/verified") is True, "engines_synced": len(m.get("sync/engines_synced", [])),
               "error": (m.get("sync/error") or (str(err) if err else None) or "")[:200] or None}
        if armed is not None:
            row["fault"] = self._settle_fault(st, armed, err)
            allocator.trim()  # the fault harness's garbage (its killer, the proofs, a failed sync's traceback)
        steps_s["sync"] = lap()
        row["in_flight"] = self.load.settle((t0, t1))  # labkit requests that overlapped the sync
        steps_s["settle"] = lap()
        row["resources"] = resources.compact(resources.sample([os.getpid()]))
        row["reviving"] = sorted(self.reviving)  # engines restarting in the background as it was read
        threads = resources.thread_names()
        if threads != self.threads:  # which of the driver's threads came or went, by name (soak/driver_threads)
            row["driver_threads"], self.threads = resources.thread_change(self.threads, threads), threads
        steps_s["sample"] = lap()
        if (st.index + 1) % cfg.accept_every == 0:
            row["acceptance"] = self._acceptance()
            steps_s["acceptance"] = lap()
        row["step_s"] = steps_s
        return row

    def _arm(self, st: Step, scfg) -> dict:
        new, n_buckets, n_groups = about_to_send(self.trainer, self.spec, scfg)
        old = [None if i in self.replicas.fenced else e.checksums() for i, e in enumerate(self.engines)]
        tmp = tempfile.mkdtemp(prefix="labkit_soak_fault_")
        killer = arm_fault(st.fault, self.trainer.actors[0], self.engines[1], n_buckets, n_groups, tmp,
                           self.cfg.deadline_s)
        return {"new": new, "old": old, "tmp": tmp, "killer": killer}

    def _settle_fault(self, st: Step, armed: dict, err) -> dict:
        """Proof the fault fired, what each engine serves (before anything else talks to it), and the parts it
        killed brought back: a new trainer now; a fenced engine in the background (`revive_fenced`)."""
        t, killer = st.fault, armed["killer"]
        if killer is not None:
            killer.join(timeout=self.cfg.deadline_s)
        fired = fault_fired(t, armed["tmp"], killer, err)
        shutil.rmtree(armed["tmp"], ignore_errors=True)
        states = [self._state(i, armed["old"][i], armed["new"]) for i in range(len(self.engines))]
        if trainer_answers(self.trainer):
            fpt.disarm_in_actor(self.trainer.actors[0])
        else:
            self.trainer.shutdown()
            self.trainer, self.restarts["trainer"] = self.new_trainer(), self.restarts["trainer"] + 1
        if t.point == "engine.apply" and 1 not in self.replicas.fenced:  # armed in the engine (a fenced one is
            self._disarm_engine()  # restarted, and a new actor has nothing armed)
        fenced = sorted(self.replicas.fenced)
        live = [e.checksums() for i, e in enumerate(self.engines) if i not in fenced]
        return {"sync": st.index, "kind": t.kind, "transport": t.transport, "point": t.point, "fired": fired,
                "states": states, "error": None if err is None else str(err)[:200], "fenced": fenced,
                "engines_agree": all(a == live[0] for a in live)}

    def _disarm_engine(self) -> None:
        """The actor engine's failpoint cleared before the next sync; an engine that does not answer is fenced (and
        revived like a dead one), not left live with a fault still armed."""
        import ray

        try:
            fpt.disarm_in_actor(self.engines[1]._actor, timeout_s=10)
        except ray.exceptions.RayError:
            self.replicas.fenced.add(1)

    def revive_fenced(self, wait: bool = False) -> None:
        """Fenced engines come back without holding up the syncs: one that is dead or wedged restarts in the
        background (a model load, tens of seconds on 2 cores) while the others take syncs; once it answers, it
        gets the last good weights here, between syncs (a fast restore: the host copy is not written meanwhile),
        and rejoins. `wait`: until every engine is back (an engine fault needs the engine it lands in serving)."""
        for i in sorted(self.replicas.fenced):
            job = self.reviving.get(i) or self._restart_in_background(i)
            if wait:
                job["thread"].join()
            if job["thread"].is_alive():
                continue
            del self.reviving[i]
            self.replicas.revive(i, timeout_s=self.cfg.timeout_s * 12, pause_mode=self.cfg.pause_mode)
            self.revivals.append({"engine": i, "restarted": job["restarted"], "error": job["error"],
                                  "seconds": round(time.monotonic() - job["t0"], 2)})

    def _restart_in_background(self, i: int) -> dict:
        job = {"t0": time.monotonic(), "restarted": False, "error": None}

        def restart():
            try:
                if not self.replicas.healthy(i):
                    self.engines[i].restart()
                    job["restarted"] = True
            except Exception as e:  # noqa: BLE001 - revive() below tries again and raises what it finds
                job["error"] = f"{type(e).__name__}: {e}"[:200]

        job["thread"] = threading.Thread(target=restart, daemon=True, name=f"labkit-soak-restart-{i}")
        job["thread"].start()
        self.reviving[i] = job
        return job

    def _state(self, i: int, old: dict, new: dict) -> str:
        """old / new / neither (half-updated) for an engine that serves; fenced for one cut off."""
        if i in self.replicas.fenced:
            return "fenced"
        now = self.engines[i].checksums()
        return "old" if now == old else "new" if now == new else "neither"

    def _acceptance(self) -> dict:
        """The served draft's greedy acceptance on the held-out prompts, measured twice from two reads of the
        served engine's weights: equal to the request, or something other than a sync changed the draft."""
        from labkit.mtp.speculative import Speculator

        engine, runs = self.engines[0], []
        for _ in range(2):
            weights = {n: engine.get_weights_by_name(n).reshape(shape)
                       for n, (shape, _) in self.spec["tensors"].items()}
            out = Speculator(self.model, weights).generate(self.eval_ids, k=2, temperature=0.0,
                                                           max_new_tokens=self.cfg.max_new_tokens, seed=0,
                                                           progress=False)
            runs.append([r["spec_num_correct_drafts"] for r in out["requests"]])
        del weights, out["requests"]
        allocator.trim()  # the instrument's garbage, not the driver's growth (labkit.cluster.allocator.trim)
        digest = hashlib.sha256(repr(sorted(engine.checksums().items())).encode()).hexdigest()[:16]
        return {"version": engine.weight_version, "weights": digest, "accepted": runs[0],
                "accept_rate": out["metrics"]["mtp/accept_rate"], "repeat_equal": runs[0] == runs[1]}


def where(e: BaseException, frames: int = 4) -> str:
    """The innermost frames of `e`'s traceback, file:line function: an aborted run says where it stopped."""
    import traceback

    tb = traceback.extract_tb(e.__traceback__)[-frames:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(tb))


def run(cfg: SoakConfig | None = None, on_row=None) -> dict:
    """The soak: `cfg.minutes` of steps, then the summary (labkit.lab.soak.summary). `on_row(row)` per sync."""
    from tqdm.auto import tqdm

    cfg = cfg or SoakConfig()
    schedule = steps(cfg.seed, cfg.transports, cfg.bucket_mbs, cfg.kinds, cfg.fault_every)
    t_start, log, soak, aborted = time.perf_counter(), RowLog(), None, None
    try:
        soak = Soak(cfg)
        startup_s, end = time.perf_counter() - t_start, time.monotonic() + cfg.minutes * 60
        bar = tqdm(desc="soak", unit="sync", disable=not cfg.progress, total=None)
        for st in schedule:
            if time.monotonic() >= end:
                break
            try:
                row = soak.step(st)
            except Exception as e:  # noqa: BLE001 - the run so far is summarized, not lost; the verdict fails
                aborted = f"sync {st.index}: {type(e).__name__}: {e}"[:300] + f" (at {where(e)})"
                break
            log.append(row)  # on disk, not in the driver the run judges (labkit.lab.soak.rowlog)
            bar.update()
            bar.set_postfix_str(f"{st.transport} {st.fault.kind if st.fault else ''}".strip())
            if on_row is not None:
                on_row(row)
        bar.close()
        try:
            soak.revive_fenced(wait=True)  # every engine back before the run is judged and closed
        except Exception as e:  # noqa: BLE001 - said in the verdict
            aborted = aborted or f"revival at the end: {type(e).__name__}: {e}"[:400]
        serving, restarts = soak.load.counts(), {**soak.restarts, "revivals": list(soak.revivals)}
        final = resources.compact(resources.sample([os.getpid()]))  # the last sync's next reading
    finally:
        if soak is not None:
            soak.close()
        rows, _ = log.rows(), log.close()
    out = summarize(rows, serving, restarts, cfg, startup_s, time.perf_counter() - t_start,
                    {"fds ray log_monitor": int(os.environ.get("RAY_LOG_MONITOR_MAX_OPEN_FILES", "200"))}, final)
    if aborted:
        out.update({"soak/aborted": aborted, "soak/ok": False, "soak/targets_met": False})
    return out


def load_or_run(path: str, minutes: float = 0.0, **cfg) -> dict:
    """A stored soak (`path`, relative to the repository when not found here) when minutes is 0, else a fresh run
    of that many minutes (notebook 06)."""
    import json

    if minutes > 0:
        return run(SoakConfig(minutes=minutes, **cfg))
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = Path(__file__).resolve().parents[3] / path
    if not p.is_file():
        raise FileNotFoundError(f"RUN={path!r} is invalid: no stored soak there (make one with "
                                f"`labkit soak --minutes 20 --out {path}`, or set MINUTES > 0)")
    return json.loads(p.read_text())

