"""The soak's verdict from its per-sync rows (pure: no engine, no Ray): what landed, what the clients saw, what grew.

Definitions (each a `soak/*` key):
- half_updated: an engine that serves (not fenced) holding neither the weights before a faulted sync nor those
  the trainer sent, bitwise (labkit.lab.faults.plan.half_updated's meaning, per engine);
- mixed_responses: a labkit client response whose tokens are not its reported version's greedy output
  (labkit.lab.bench.serve.classify); refused: one aborted by a pause;
- rss: per process with `MIN_SAMPLES` samples after its warm-up (`processes`), the least-squares slope of resident
  MB (less the pages of Ray's object store it maps, labkit.lab.soak.resources.store_pages) over syncs, per 100
  syncs, with its 95 % interval; within target when the slope is at most
  `cfg.rss_mb_per_100`, or its interval includes 0 (no growth shown: a short run's noise alone never fails it).
  `inconclusive` names a process that passes with an interval reaching past the target: too short a run to rule
  that growth out;
- levels: open file descriptors and threads (per process), /dev/shm files and Ray object-store bytes after every
  sync after warm-up, against their level during warm-up (the most they held then);
- trend: sync end-to-end seconds and pause seconds of the clean syncs after warm-up (labkit.lab.soak.trend).
"""

from __future__ import annotations

import statistics
from collections import Counter

from labkit.lab.soak.trend import slope_ci95, trend

# A process with fewer samples after its warm-up (restarted late) has no slope to judge: the target is per 100 syncs,
# and a slope from fewer than 30 extrapolates more than 3x (data/soak_cpu.json at bcf5e06: an engine actor judged on
# 12 samples, +0.3 MB over them, read as +2.48 MB per 100 syncs).
MIN_SAMPLES = 30
MB = 2**20


def _faults(rows: list[dict]) -> dict:
    faults = [r["fault"] for r in rows if "fault" in r]
    states = Counter(s for f in faults for s in f["states"])
    landed = [r for r in rows if "fault" in r]
    return {"soak/faults": len(faults), "soak/faults_fired": sum(f["fired"] for f in faults),
            "soak/fault_kinds": dict(Counter(f["kind"] for f in faults)),
            "soak/fault_kinds_fired": len({f["kind"] for f in faults if f["fired"]}),
            "soak/fault_transports": dict(Counter(f["transport"] for f in faults)),
            "soak/fault_engine_states": dict(states), "soak/half_updated": states.get("neither", 0),
            "soak/faulted_syncs_verified": sum(r["verified"] for r in landed),
            "soak/faulted_syncs_restored": sum(r["failed"] for r in landed),
            "soak/engines_disagree_after_fault": sum(not f["engines_agree"] for f in faults),
            "soak/fenced": sum(len(f["fenced"]) for f in faults)}


def _serving(serving: dict, rows: list[dict]) -> dict:
    lk, oa = serving["labkit"], serving["openai"]
    return {"soak/requests": sum(lk.values()), "soak/requests_ok": lk["ok"] + lk["spanned"],
            "soak/mixed_responses": lk["mixed"], "soak/refused": lk["aborted"], "soak/requests_failed": lk["failed"],
            "soak/openai_sent": oa.get("sent", 0), "soak/openai_failed": oa.get("failed", 0),
            "soak/openai_checked": oa.get("checked", 0), "soak/openai_mismatched": oa.get("mismatched", 0),
            "soak/openai_overlapped_sync": oa.get("overlapped_sync", 0),
            "soak/openai_errors": {k[6:]: v for k, v in oa.items() if k.startswith("error:")},
            "soak/syncs_with_no_request_in_flight": sum(not r["in_flight"] for r in rows),
            "soak/request_errors": serving.get("labkit_errors", {}),
            "soak/versions_changing_greedy": sum(c > 0 for c in serving.get("prompts_changed", [])),
            "soak/versions": len(serving.get("prompts_changed", [])) + 1}


def processes(rows: list[dict], warmup: int) -> dict[str, dict]:
    """Each process's samples ("role pid": syncs, rss, fds, threads) and where its own warm-up ends: `warmup`
    syncs into its life, for a process there from the first sync and one started later alike. A process restarted
    after a fault starts as cold as the run did: a new trainer rank allocates for each transport, bucket size and
    engine it meets first (data/soak_cpu.json at 3e7a957: +30 MB at its first sync, then steps of 1-6 MB for ten
    syncs and more, and +-2 MB from one transport to the next), so a shorter warm-up reads its first meetings as a
    slope. One that dies before `warmup + MIN_SAMPLES` syncs is reported too short to judge, with its life."""
    out: dict[str, dict] = {}
    for r in rows:
        for pid, p in r["resources"]["procs"].items():
            s = out.setdefault(f"{p[0]} {pid}", {"x": [], "rss": [], "fds": [], "threads": []})
            for k, v in zip(("x", "rss", "fds", "threads"), (r["sync"], _own(p) / MB, p[2], p[3])):
                s[k].append(v)
    for s in out.values():
        s["start"] = s["x"][0] + warmup
    return out


def _own(p: list) -> int:
    """A process's resident bytes less the pages of Ray's object store it maps (p[5] where sampled): the arena's
    pages stay resident in every process that ever read them, bounded by the store, whose bytes are judged apart
    (`store_bytes`)."""
    return p[1] - (p[5] if len(p) > 5 else 0)


def _rss(procs: dict[str, dict], target: float) -> dict:
    per, short = {}, {}
    for name, s in sorted(procs.items()):
        keep = [k for k, x in enumerate(s["x"]) if x >= s["start"]]
        xs, mb = [s["x"][k] for k in keep], [s["rss"][k] for k in keep]
        if len(xs) < MIN_SAMPLES:
            short[name] = len(s["x"])  # the syncs it lived through
            continue
        slope, ci = slope_ci95(xs, mb)
        within = slope * 100 <= target or (ci is not None and ci[0] <= 0)
        per[name] = {"mb_per_100": round(slope * 100, 3),
                     "ci95": None if ci is None else [round(v * 100, 3) for v in ci], "within": within,
                     "inconclusive": within and (ci is None or ci[1] * 100 > target),
                     "samples": len(xs), "from_sync": xs[0], "mb_last": round(mb[-1], 1)}
    worst = max(per.items(), key=lambda kv: kv[1]["mb_per_100"], default=(None, None))
    return {"soak/rss_per_process": per, "soak/rss_too_short": short,
            "soak/rss_worst": worst[0], "soak/rss_worst_mb_per_100": worst[1]["mb_per_100"] if worst[1] else None,
            "soak/rss_inconclusive": sorted(k for k, v in per.items() if v["inconclusive"]),
            "soak/rss_within_target": all(v["within"] for v in per.values())}


def _levels(rows: list[dict], procs: dict[str, dict], warmup: int, bounds: dict[str, int]) -> dict:
    """How far above its warm-up level each quantity went after warm-up (0 everywhere: it came back every sync).
    The level is the most it held during its warm-up (the process's own, for fds and threads): a server's
    connections come and go with its clients, a leak climbs past any level. A quantity with a cap of its own
    (`bounds`, "fds <role>": Ray's log monitor keeps up to RAY_LOG_MONITOR_MAX_OPEN_FILES files open) is judged
    against its least plus that cap instead (`soak/levels_bounded`). A sample read while an engine was
    restarting in the background is not judged (`soak/levels_samples_reviving`): the restart's own thread,
    connections and objects are in flight then, not left behind by a sync; a leak stays and shows in the next.
    For the same reason a reading above the level counts only when the next judged reading is above it too: Ray's
    dashboard and its agent poll on timers of their own, and a connection they hold open for a moment can land on
    a reading (data/soak_store_pages_cpu.json: the agent +3 descriptors at sync 233, back at 234). The last sync's
    next reading is the one the run takes after its loop (`confirming`, judged only as that): without it the last
    sync's reading counted on its own, and the agent's timer landed there (data/soak_cpu.json at 69cc59c: +3
    descriptors at sync 329, the last, and at 174, back at 175)."""
    excess: dict[str, float] = {}
    quiet = {r["sync"] for r in rows if not r.get("reviving")}
    confirming = rows[-1]["sync"] if rows and rows[-1].get("confirming") else None

    def judge(key: str, xs: list, vals: list, start: int) -> None:
        level = max((v for x, v in zip(xs, vals) if x < start and v is not None), default=None)
        read = [(x, v) for x, v in zip(xs, vals) if level is not None and x >= start and x in quiet and v is not None]
        for (x, v), after in zip(read, [*(v for _, v in read[1:]), None]):  # kept: above at the next reading too
            kept = v if after is None else min(v, after)  # (the last reading counts alone unless confirmed)
            if x != confirming and kept > level:
                excess[key] = max(excess.get(key, 0), kept - level)

    xs = [r["sync"] for r in rows]
    for q in ("shm_files", "store_bytes"):
        judge(q, xs, [r["resources"][q] for r in rows], warmup)
    bounded = {}
    for name, s in procs.items():
        for q in ("fds", "threads"):
            cap = bounds.get(f"{q} {name.rsplit(' ', 1)[0]}")
            if cap is None:
                judge(f"{q} {name}", s["x"], s[q], s["start"])
                continue
            least, most = min(s[q]), max(s[q])
            bounded[f"{q} {name}"] = {"cap": cap, "least": least, "most": most}
            if most > least + cap:
                excess[f"{q} {name}"] = most - least - cap
    return {"soak/levels_exceeded": excess, "soak/levels_returned": not excess, "soak/levels_bounded": bounded,
            "soak/levels_samples_reviving": sum(r["sync"] >= warmup and r["sync"] not in quiet for r in rows)}


def _trends(rows: list[dict], warmup: int) -> dict:
    clean = [r for r in rows[warmup:] if "fault" not in r and r["verified"]]
    out = {}
    for q in ("e2e_s", "pause_s"):
        ys = [r[q] for r in clean]
        out[f"soak/{q}_median"] = round(statistics.median(ys), 4) if ys else None
        out[f"soak/trend/{q}"] = trend([r["sync"] for r in clean], ys) if len(clean) >= 3 else None
    out["soak/no_upward_trend"] = all(t is None or t["upward"] is not True
                                      for k, t in out.items() if k.startswith("soak/trend/"))
    return out


def _acceptance(rows: list[dict]) -> dict:
    measured = [{"sync": r["sync"], **r["acceptance"]} for r in rows if "acceptance" in r]
    seen, changed = {}, 0
    for a in measured:  # the same weights served again (a restore) must give the same acceptance, per request
        changed += a["weights"] in seen and seen[a["weights"]] != a["accepted"]
        seen.setdefault(a["weights"], a["accepted"])
    return {"soak/acceptance": [{k: a[k] for k in ("sync", "version", "weights", "accept_rate", "repeat_equal")}
                                for a in measured],
            "soak/acceptance_repeat_equal": all(a["repeat_equal"] for a in measured),
            "soak/acceptance_changed_at_same_weights": changed}


def series(rows: list[dict]) -> dict:
    """What the figures draw: per sync its times and fault, per process its resident MB."""
    procs: dict[str, list] = {}
    for r in rows:
        for pid, (role, rss, *_) in r["resources"]["procs"].items():
            procs.setdefault(f"{role} {pid}", []).append([r["sync"], round(rss / MB, 2)])
    return {"sync": [r["sync"] for r in rows], "e2e_s": [r["e2e_s"] for r in rows],
            "pause_s": [r["pause_s"] for r in rows], "fault": [r.get("fault", {}).get("kind") for r in rows],
            "transport": [r["transport"] for r in rows], "rss_mb": procs,
            "shm_files": [r["resources"]["shm_files"] for r in rows],
            "store_bytes": [r["resources"]["store_bytes"] for r in rows],
            "private_mb": _private(rows), "fds": _changes(rows, 2), "threads": _changes(rows, 3),
            "store_pages_mb": {k: v for k, v in _changes(rows, 5, 1 / MB).items() if any(mb for _, mb in v)}}


def _changes(rows: list[dict], k: int, scale: float = 1.0) -> dict:
    """Per process, [sync, value] of field `k` (2: fds, 3: threads, 5: store pages, read as MB with `scale`) where
    it changed (and its first): a descriptor that stays open shows as a step, beside the fault before it."""
    out: dict[str, list] = {}
    for r in rows:
        for pid, p in r["resources"]["procs"].items():
            v = (p[k] if scale == 1.0 else round(p[k] * scale, 2)) if len(p) > k else 0
            s = out.setdefault(f"{p[0]} {pid}", [])
            if not s or s[-1][1] != v:
                s.append([r["sync"], v])
    return out


def _private(rows: list[dict]) -> dict:
    """Per process, resident MB less its shared pages (what it alone holds: a mapping of /dev/shm or a library
    counts in RSS as soon as it is touched, and says nothing of a leak of its own)."""
    out: dict[str, list] = {}
    for r in rows:
        for pid, p in r["resources"]["procs"].items():
            if len(p) > 4:
                out.setdefault(f"{p[0]} {pid}", []).append([r["sync"], round((p[1] - p[4]) / MB, 2)])
    return out


def summarize(rows: list[dict], serving: dict, restarts: dict, cfg, startup_s: float, wall_s: float,
              bounds: dict[str, int] | None = None, final: dict | None = None) -> dict:
    """The soak's `soak/*` keys from its rows; `final`: the resource reading taken after the loop, which confirms
    or clears the last sync's levels (`_levels`)."""
    clean = [r for r in rows if "fault" not in r]
    out = {"soak/minutes": cfg.minutes, "soak/seed": cfg.seed, "soak/warmup": cfg.warmup,
           "soak/syncs": len(rows), "soak/syncs_verified": sum(r["verified"] for r in rows),
           "soak/clean_syncs_not_verified": sum(not r["verified"] for r in clean),
           "soak/syncs_into_one_engine": sum(r.get("engines_synced", 2) < 2 for r in rows if r["verified"]),
           "soak/step_s_total": {k: round(sum(r.get("step_s", {}).get(k, 0.0) for r in rows), 1)
                                 for k in ("revive_wait", "train", "sync", "settle", "sample", "acceptance")},
           "soak/transports": dict(Counter(r["transport"] for r in rows)),
           "soak/bucket_mbs": dict(Counter(str(r["bucket_mb"]) for r in rows)),
           "soak/trainer_restarts": restarts.get("trainer", 0),
           "soak/engine_revivals": len(restarts.get("revivals", [])),
           "soak/engine_restarts": sum(r["restarted"] for r in restarts.get("revivals", [])),
           "soak/revive_s_max": max((r["seconds"] for r in restarts.get("revivals", [])), default=0.0),
           "soak/revivals": restarts.get("revivals", []),
           "soak/errors": dict(Counter(r["error"][:120] for r in clean if r["error"]))}
    out.update(_faults(rows))
    out["soak/fault_rows"] = [r["fault"] for r in rows if "fault" in r]
    out["soak/driver_threads"] = [{"sync": r["sync"], **r["driver_threads"]} for r in rows if "driver_threads" in r]
    out.update(_serving(serving, rows))
    out["soak/leaks_judged"] = judged = len(rows) >= cfg.warmup + MIN_SAMPLES
    if judged:  # slopes and levels need samples past warm-up: a short run reports them not judged
        procs = processes(rows, cfg.warmup)
        out.update(_rss(procs, cfg.rss_mb_per_100))
        ends = rows + [{"sync": rows[-1]["sync"] + 1, "resources": final, "confirming": True}] if final else rows
        out.update(_levels(ends, processes(ends, cfg.warmup) if final else procs, cfg.warmup, bounds or {}))
        out.update(_trends(rows, cfg.warmup))
    out.update(_acceptance(rows))
    out["soak/ok"] = verdict(out, judged)
    out["soak/targets_met"] = out["soak/ok"] and judged and out["soak/syncs"] >= 300 and out["soak/faults"] >= 30 \
        and out["soak/fault_kinds_fired"] >= 8
    out.update({"soak/startup_s": round(startup_s, 1), "soak/wall_s": round(wall_s, 1), "soak/series": series(rows)})
    return out


def verdict(m: dict, leaks_judged: bool) -> bool:
    """Every check the run could decide: what landed and what was served always; leaks and drifts once the run went
    `MIN_SAMPLES` syncs past warm-up (the counts of the 20-minute target are apart: `soak/targets_met`)."""
    ok = (m["soak/syncs"] > 0 and m["soak/clean_syncs_not_verified"] == 0 and m["soak/half_updated"] == 0
          and m["soak/faults_fired"] == m["soak/faults"] and m["soak/engines_disagree_after_fault"] == 0
          and m["soak/mixed_responses"] == 0 and m["soak/refused"] == 0 and m["soak/requests_failed"] == 0
          and m["soak/openai_failed"] == 0 and m["soak/openai_mismatched"] == 0
          and m["soak/acceptance_repeat_equal"] and m["soak/acceptance_changed_at_same_weights"] == 0)
    if leaks_judged:
        ok = ok and m["soak/rss_within_target"] and m["soak/levels_returned"] and m["soak/no_upward_trend"]
    return bool(ok)
