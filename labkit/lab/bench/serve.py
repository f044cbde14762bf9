"""`labkit bench serve-sync`: atomic syncs while the engine serves a steady stream of greedy requests.

In RL the engine serves rollouts while new weights arrive; a response must come from one weight version,
the one it reports. Per SGLang pause mode (abort, retract, in_place), client threads send greedy requests
to an SGLang HTTP server on 127.0.0.1 (bounded in count and time) while the driver runs train-step + atomic
sync N times. After each sync the clients stop, the engine drains, and the driver records the new version's
greedy output per prompt (the reference, from the idle engine) and checks every response finished since:
- ok: one version span and tokens == that version's greedy output;
- spanned: SGLang reports several spans (meta_info["weight_versions"], a request continued across a
  retract/in_place pause); each span must equal its version's greedy continuation of prompt + the tokens
  before the span, else mixed;
- aborted: finish_reason "abort" (abort mode; the client retries); mixed: anything else.
`serve/ok` is false (exit code 1) when any response is mixed or failed, a sync failed, or no request was in
flight during a sync (a run that tested nothing). in_place is refused by labkit's atomic guard (running
requests would keep KV of the old weights; `SyncConfig` says why): it is reported as `serve/refused/in_place`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, get_args

from labkit.config import TrainConfig, check, check_choice
from labkit.engine import EngineConfig, EngineHandle
from labkit.engine.config import PAUSE_MODES, PauseMode
from labkit.models.tiny import make_tiny_mimo
from labkit.models.tokenizer import encode
from labkit.sync import SyncConfig, engine_spec
from labkit.tasks import arith
from labkit.lab.bench.load import Clients
from labkit.lab.faults.plan import SPEC

MODES = PAUSE_MODES
OUTCOMES = ("ok", "spanned", "aborted", "mixed")
Backend = Literal["http", "actor"]
BACKENDS = get_args(Backend)


@dataclass(kw_only=True, slots=True, frozen=True)
class ServeBenchConfig:
    """`labkit bench serve-sync`: what runs per pause mode."""

    modes: tuple[PauseMode, ...] = MODES
    """SGLang pause modes to run, one after the other."""
    syncs: int = 3
    """Train-step + atomic sync per pause mode."""
    clients: int = 4
    """Client threads streaming requests."""
    max_requests: int = 200
    """Requests per pause mode at most."""
    max_seconds: float = 60.0
    """Per mode: the clients stop by themselves."""
    prompts: int = 8
    """Distinct prompts the clients cycle through."""
    max_new_tokens: int = 16
    """ignore_eos: every response has this length."""
    bucket_mb: float = 0.05
    """Small buckets: a sync long enough to overlap requests."""
    timeout_s: float = 30.0
    """One engine call / one wait."""
    lr: float = 1e-4
    """The trainer's: syncs must change greedy outputs (serve/prompts_changed_*). Small on purpose: on the random
    tiny model a large step (2e-2, 2e-3) collapses every greedy output to one token (EOS) within a step or two,
    after which syncs change nothing and a mixed response could not be seen; at 1e-4 every sync of the stored
    run changed at least 6 of its 8 prompts (data/bench_serve_sync_cpu.json, serve/prompts_changed_per_sync_min)."""
    backend: Backend = "http"
    """http (an SGLang server; pause modes apply) or actor (Workbench's Ray actor engine)."""

    def __post_init__(self) -> None:
        check(isinstance(self.modes, tuple) and self.modes and all(m in MODES for m in self.modes), "modes",
              self.modes, f"a non-empty tuple of {', '.join(MODES)}")
        check_choice(self, "backend")
        for f in ("syncs", "clients", "max_requests", "prompts", "max_new_tokens"):
            v = getattr(self, f)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f, v, "an integer >= 1")
        for f in ("max_seconds", "bucket_mb", "timeout_s", "lr"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f, v, "a positive number")


def spans_of(tokens: list[int], meta: dict) -> list[dict]:
    spans = meta.get("weight_versions")
    if spans:
        return [dict(s) for s in spans]
    return [{"version": meta.get("weight_version"), "start": 0, "end": len(tokens)}]


def classify(tokens: list[int], meta: dict, expected) -> str:
    """One response -> ok | spanned | aborted | mixed. `expected(version, start)`: that version's greedy
    tokens after the prompt plus tokens[:start], or None when unknown (unknown never counts as ok)."""
    fr = meta.get("finish_reason")
    if isinstance(fr, dict) and fr.get("type") == "abort":
        return "aborted"
    spans = spans_of(tokens, meta)
    for i, s in enumerate(spans):
        ref, last = expected(s["version"], s["start"]), i == len(spans) - 1
        got = list(tokens[s["start"]:] if last else tokens[s["start"]:s["end"]])
        if ref is None or got != list(ref if last else ref[:s["end"] - s["start"]]):
            return "mixed"  # the last span runs to the end: a truncated answer is not its version's output
    return "ok" if len(spans) == 1 else "spanned"


def paused_within(pauses, t0: float, t1: float) -> float:
    """Seconds the engine was paused by pauses that began in [t0, t1] (a handle's `pauses` keeps the last 64, so
    they are found by time: counting entries stops working once the deque is full)."""
    return sum((b if b is not None else t1) - a for a, b in list(pauses) if t0 <= a <= t1)


def _greedy(engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    outs = engine.generate(input_ids=prompts, sampling={"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})
    return [o["tokens"] for o in outs]


def _check(rows: list[dict], prompts, refs: dict, engine, cfg: ServeBenchConfig) -> None:
    """Classify finished rows (engine idle, serving its current version): continuations of spanned rows
    are the idle engine's greedy output for prompt + prefix, under the version it serves now, all taken in one
    batched request (each one's own length is a prefix of the longest: greedy with ignore_eos is causal)."""
    now, todo = engine.weight_version, [r for r in rows if "outcome" not in r]
    for r in todo:
        if "error" in r:
            r["outcome"] = "failed"
    wanted = sorted({(i, s["start"]) for i, r in enumerate(todo) if "error" not in r
                     for s in spans_of(r["tokens"], r["meta"])[1:] if s["version"] == now})
    conts = {}
    if wanted:
        outs = _greedy(engine, [prompts[todo[i]["prompt"]] + todo[i]["tokens"][:start] for i, start in wanted],
                       cfg.max_new_tokens - min(start for _, start in wanted))
        conts = {(i, start): out[:cfg.max_new_tokens - start] for (i, start), out in zip(wanted, outs)}
    for i, r in enumerate(todo):
        if "outcome" in r:
            continue

        def expected(v, start, i=i, r=r):
            if start == 0:
                return refs.get(v, {}).get(r["prompt"])
            return conts.get((i, start)) if v == now else None

        r["outcome"] = classify(r["tokens"], r["meta"], expected)


def run_mode(wb, guard, expected, mode: str, prompts, refs: dict, cfg: ServeBenchConfig) -> dict:
    from labkit.sync.atomic import SyncFailed  # crosses torch: the CLI imports this module for its config

    scfg = SyncConfig(bucket_mb=cfg.bucket_mb, progress=False, timeout_s=cfg.timeout_s,
                      deadline_s=4 * cfg.timeout_s, pause_mode=mode)
    clients, windows, failed_syncs = Clients(wb.engine, prompts, cfg), [], []
    for t in clients.threads:
        t.start()
    try:
        for k in range(cfg.syncs):
            wb.train(1, batch_size=8, progress=False)
            clients.open(max(1, cfg.max_requests // cfg.syncs))
            clients.wait_in_flight()  # the stream is running when the sync starts
            t0 = time.monotonic()
            try:
                guard.sync(wb.trainer, scfg, expected, f"{mode}-{k + 1}")
            except SyncFailed as e:
                failed_syncs.append(str(e)[:300])
            t1 = time.monotonic()
            windows.append({"sync": (t0, t1), "paused_s": paused_within(wb.engine.pauses, t0, t1)})
            clients.drain()
            refs[wb.engine.weight_version] = dict(enumerate(_greedy(wb.engine, prompts, cfg.max_new_tokens)))
            _check(clients.rows, prompts, refs, wb.engine, cfg)
    finally:
        clients.close()
    _check(clients.rows, prompts, refs, wb.engine, cfg)
    return summarize_mode(clients.rows, windows, failed_syncs)


def summarize_mode(rows: list[dict], windows: list[dict], failed_syncs: list[str]) -> dict:
    def during(r):
        return any(r["t0"] < t1 and r["t1"] > t0 for t0, t1 in (w["sync"] for w in windows))

    n = max(1, len(windows))
    return {"requests": len(rows), **{o: sum(r.get("outcome") == o for r in rows) for o in OUTCOMES},
            "failed": sum(r.get("outcome") == "failed" for r in rows),
            "retracted": sum(bool(r.get("meta", {}).get("num_retractions")) for r in rows),
            "in_flight_during_sync": sum(during(r) for r in rows),
            "pause_seconds": round(sum(w["paused_s"] for w in windows) / n, 4),
            "sync_seconds": round(sum(w["sync"][1] - w["sync"][0] for w in windows) / n, 4),
            "syncs": len(windows), "sync_failed": len(failed_syncs),
            "errors": sorted({r["error"] for r in rows if "error" in r})[:3] + failed_syncs[:3]}


def run(cfg: ServeBenchConfig | None = None, model_dir: str | None = None, progress: bool = True) -> dict:
    """One SGLang HTTP server (127.0.0.1) and one trainer for all modes; a tiny random MiMo unless model_dir."""
    # Both cross torch and Ray: the CLI imports this module for ServeBenchConfig only.
    from labkit.sync.atomic import guard_for
    from labkit.workbench.core import Workbench

    import shutil
    import tempfile
    from pathlib import Path


    cfg, t_start, tmp = cfg or ServeBenchConfig(), time.perf_counter(), tempfile.mkdtemp(prefix="labkit_serve_")
    server = wb = None
    try:
        model = model_dir or str(make_tiny_mimo(Path(tmp) / "tiny", SPEC))
        ecfg = EngineConfig(model_dir=model, dtype="float32", max_total_tokens=4096, mem_fraction_static=0.05,
                            call_timeout_s=cfg.timeout_s)
        # Every sync must change some greedy outputs, or a mixed response could not be told apart (see cfg.lr)
        if cfg.backend == "http":
            server = EngineHandle.launch(ecfg)
            wb = Workbench(model, engine_cfg=ecfg, engine_url=server.url, train_cfg=TrainConfig(lr=cfg.lr))
        else:  # the handle holds requests while the actor is paused; in-flight ones finish first (one call at a time)
            wb = Workbench(model, engine_cfg=ecfg, train_cfg=TrainConfig(lr=cfg.lr))
        guard, expected = guard_for(wb.engine), engine_spec(model, ecfg.dtype)
        prompts = [encode(p.prompt) for p in arith.problems(cfg.prompts, seed=7)]
        idle = []
        for k in range(2):  # the first also adopts the model dir as last good copy: report the second
            wb.train(1, batch_size=8, progress=False)
            t0 = time.monotonic()
            guard.sync(wb.trainer, SyncConfig(bucket_mb=cfg.bucket_mb, progress=False, timeout_s=cfg.timeout_s,
                                              deadline_s=4 * cfg.timeout_s), expected, f"idle-{k + 1}")
            idle.append(time.monotonic() - t0)
        refs = {wb.engine.weight_version: dict(enumerate(_greedy(wb.engine, prompts, cfg.max_new_tokens)))}
        per_mode = {}
        for mode in cfg.modes:
            if progress:
                print(f"serve-sync: mode {mode} ...", flush=True)
            try:
                per_mode[mode] = run_mode(wb, guard, expected, mode, prompts, refs, cfg)
            except ValueError as e:  # refused by design before any traffic (in_place under the atomic guard)
                per_mode[mode] = {"refused": str(e)}
            except Exception as e:  # noqa: BLE001 - e.g. the engine stopped answering: later modes cannot run
                per_mode[mode] = {"error": f"{type(e).__name__}: {e}"[:400]}
                break
    finally:
        if wb is not None:
            wb.close()
        if server is not None:
            server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return summarize(per_mode, refs, idle[-1], cfg, time.perf_counter() - t_start)


def summarize(per_mode: dict, refs: dict, idle_s: float, cfg: ServeBenchConfig, wall_s: float) -> dict:
    out = {}
    for mode, m in per_mode.items():
        if "error" in m or "refused" in m:
            out[f"serve/{'error' if 'error' in m else 'refused'}/{mode}"] = m.get("error") or m["refused"]
            continue
        for k in ("requests", "mixed", "aborted", "retracted", "spanned", "failed", "in_flight_during_sync",
                  "pause_seconds", "sync_seconds", "sync_failed", "errors"):
            out[f"serve/{'mixed_responses' if k == 'mixed' else k}/{mode}"] = m[k]
        out[f"serve/ok_responses/{mode}"] = m["ok"]
    versions = list(refs)
    changed = [sum(refs[a][p] != refs[b][p] for p in refs[a]) for a, b in zip(versions, versions[1:])]
    measured = [m for m in per_mode.values() if "refused" not in m]
    ok = (len(per_mode) == len(cfg.modes) and bool(measured) and sum(changed) > 0
          and all("error" not in m and m["mixed"] == 0 and m["failed"] == 0 and m["sync_failed"] == 0
                  and m["in_flight_during_sync"] > 0 for m in measured))
    out.update({"serve/ok": ok, "serve/idle_sync_seconds": round(idle_s, 4), "serve/modes": list(per_mode),
                "serve/versions": len(versions), "serve/prompts_changed_per_sync_min": min(changed, default=0),
                "serve/prompts_changed_total": sum(changed),
                "serve/backend": cfg.backend, "serve/prompts": cfg.prompts, "serve/max_new_tokens": cfg.max_new_tokens,
                "serve/clients": cfg.clients, "serve/syncs_per_mode": cfg.syncs, "serve/wall_s": round(wall_s, 1),
                "serve/definitions": "pause_seconds: mean per sync of pause_generation -> continue_generation "
                                     "(driver clock); sync_seconds: mean atomic sync under load; idle_sync_seconds: "
                                     "one atomic sync with no traffic; in_flight_during_sync: requests whose "
                                     "[start, end] overlaps a sync"})
    return out
