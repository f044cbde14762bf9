"""The soak's table (`labkit soak`, data/soak_cpu.json): each of the issue's targets beside what the stored run
measured and whether it was met, then the slowest-growing processes."""

from __future__ import annotations

from labkit.lab.report.markdown import md_head
from labkit.lab.report.markdown import md_row as _row


def _yes(ok) -> str:
    return "yes" if ok else "**no**"


def _trend(t: dict | None) -> str:
    if t is None:
        return "n/a"
    lo, hi = t["ci95_per"]
    note = ", inconclusive" if t["inconclusive"] else ""
    return f"{t['slope_per']:+.4f} s [{lo:+.4f}, {hi:+.4f}] per {t['per']} (median {t['median']:.3f} s{note})"


LEAKS = (("resident memory, worst process", "<= 1 MB per 100 syncs"),
         ("fds, threads, /dev/shm, object store back to warm-up level", "every sync"),
         ("sync end to end: trend", "no upward trend"), ("pause: trend", "no upward trend"))


def _leaks(r: dict) -> list[tuple]:
    measured = [f"{r['soak/rss_worst']}: {r['soak/rss_worst_mb_per_100']:+.2f} MB",
                "yes" if r["soak/levels_returned"] else ", ".join(sorted(r["soak/levels_exceeded"]))[:160],
                _trend(r["soak/trend/e2e_s"]), _trend(r["soak/trend/pause_s"])]
    met = [r["soak/rss_within_target"], r["soak/levels_returned"],
           *(r[k] is None or r[k]["upward"] is not True for k in ("soak/trend/e2e_s", "soak/trend/pause_s"))]
    return [(what, want, got, ok) for (what, want), got, ok in zip(LEAKS, measured, met)]


def soak_table(run: dict) -> list[str]:
    r = run
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["soak/fault_kinds"].items()))
    rows = [
        ("syncs", ">= 300", r["soak/syncs"], r["soak/syncs"] >= 300),
        ("faults, every one fired", ">= 30, of >= 8 kinds", f"{r['soak/faults_fired']} of {r['soak/faults']} fired, "
         f"{r['soak/fault_kinds_fired']} kinds ({kinds})", r["soak/faults"] >= 30 and r["soak/fault_kinds_fired"] >= 8
         and r["soak/faults_fired"] == r["soak/faults"]),
        ("half-updated engines", "0", r["soak/half_updated"], r["soak/half_updated"] == 0),
        ("clean syncs not verified", "0", r["soak/clean_syncs_not_verified"], r["soak/clean_syncs_not_verified"] == 0),
        ("mixed responses", "0", f"{r['soak/mixed_responses']} of {r['soak/requests']}",
         r["soak/mixed_responses"] == 0),
        ("requests refused or failed", "0 (retract)", r["soak/refused"] + r["soak/requests_failed"],
         r["soak/refused"] + r["soak/requests_failed"] == 0),
        ("OpenAI requests failed / not the greedy text", "0",
         f"{r['soak/openai_failed']} / {r['soak/openai_mismatched']} of {r['soak/openai_sent']} "
         f"({r['soak/openai_checked']} checked)", r["soak/openai_failed"] + r["soak/openai_mismatched"] == 0),
        *(_leaks(r) if r.get("soak/leaks_judged") else
          [(what, want, "not judged: too few syncs past warm-up", False) for what, want in LEAKS]),
        ("acceptance at the same weights", "equal, to the request",
         f"{len(r['soak/acceptance'])} measurements, each twice; changed at the same weights: "
         f"{r['soak/acceptance_changed_at_same_weights']}",
         r["soak/acceptance_repeat_equal"] and r["soak/acceptance_changed_at_same_weights"] == 0),
    ]
    lines = md_head(["target", "wanted", "measured", "met"])
    lines += [_row([name, want, got, _yes(ok)]) for name, want, got, ok in rows]
    lines.append("")
    if r.get("soak/aborted"):
        lines.append(f"**The run stopped early**: {r['soak/aborted']}")
        lines.append("")
    lines.append(f"{r['soak/minutes']:g} minutes after a {r['soak/startup_s']:.0f} s start, seed {r['soak/seed']}, "
                 f"warm-up {r['soak/warmup']} syncs; transports {r['soak/transports']}; trainer restarts "
                 f"{r['soak/trainer_restarts']}; engine revivals {r['soak/engine_revivals']} "
                 f"({r['soak/engine_restarts']} restarted, in the background while the other engine took syncs; "
                 f"the slowest {r['soak/revive_s_max']:.0f} s).")
    if r.get("soak/leaks_judged"):
        lines += ["", *_processes(r)]
    return lines


def _processes(r: dict, top: int = 8) -> list[str]:
    """The judged processes, fastest-growing first, and what was not judged and why."""
    per = sorted(r["soak/rss_per_process"].items(), key=lambda kv: -kv[1]["mb_per_100"])
    lines = md_head(["process", "MB per 100 syncs [95 % interval]", "from sync", "samples", "within"])
    for name, v in per[:top]:
        lo, hi = v["ci95"] or (float("nan"), float("nan"))
        lines.append(_row([name, f"{v['mb_per_100']:+.2f} [{lo:+.2f}, {hi:+.2f}]", v["from_sync"], v["samples"],
                           _yes(v["within"])]))
    short = r.get("soak/rss_too_short") or {}
    lines += ["", f"{len(per)} processes judged, the {min(top, len(per))} fastest-growing above; "
              f"{len(short)} lived too few syncs past their own warm-up to judge (restarted by faults, and their "
              f"children). Levels: {r.get('soak/levels_samples_reviving', 0)} readings taken while an engine "
              f"restarted in the background were set aside; capped caches: "
              + (", ".join(f"{k} (cap {v['cap']}, held {v['least']} to {v['most']})"
                           for k, v in (r.get("soak/levels_bounded") or {}).items()) or "none") + "."]
    return lines
