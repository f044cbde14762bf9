"""The tables of the stored runs that have no module of their own: faults, serving under syncs, delta, codec,
host threads, the roofline (bench tables: labkit.lab.report.bench; MTP: .mtp; the device check: .device)."""

from __future__ import annotations

from labkit.lab.report.markdown import md_cell, md_head
from labkit.lab.report.markdown import md_row as _row
from labkit.lab.roofline.bounds import fmt_seconds as _secs


def faults_table(run: dict) -> list[str]:
    """Per kind: trials, how many provably fired (a run stored before `fired` existed shows "not recorded"),
    recovered (fired ones only), half-updated, modified then restored, engine restarts, slowest restore."""
    head = ["kind", "trials", "fired", "recovered", "half-updated", "modified, then restored", "engine restarted",
            "slowest restore (s)"]
    lines = md_head(head)

    def fired(d: dict) -> str:
        return str(d["fired"]) if "fired" in d else "not recorded"

    for kind, k in sorted(run["faults/per_kind"].items()):
        lines.append(_row([kind, k["trials"], fired(k), k["recovered"], k["half_updated"],
                           k["modified_then_restored"], k["engine_restarted"], f"{k['recover_s_max']:.1f}"]))
    lines.append(_row(["**all**", run["faults/trials"], fired({"fired": run["faults/fired"]} if "faults/fired" in run
                                                              else {}),
                       run["faults/recovered"], run["faults/half_updated"], run["faults/modified_then_restored"],
                       run["faults/engine_restarts"], f"{run['faults/recover_s_max']:.1f}"]))
    lines.append("")
    lines.append(f"Generates answered while a sync was held mid-way: {run['faults/served_mid_sync']} of "
                 f"{run['faults/mid_sync_probes']} probes. Wall time {run['faults/wall_s'] / 60:.1f} min.")
    return lines


def serve_table(runs: list[tuple[str, dict]]) -> list[str]:
    """One row per pause mode of each stored run, the HTTP server's first; an actor-backend run has no pause mode
    (the handle holds a request that arrives during a sync until it ends)."""
    keys = [("serve/requests", "requests"), ("serve/in_flight_during_sync", "in flight during a sync"),
            ("serve/mixed_responses", "mixed"), ("serve/aborted", "aborted"), ("serve/retracted", "retracted"),
            ("serve/pause_seconds", "paused per sync (s)"), ("serve/sync_seconds", "sync under load (s)")]
    head = ["backend", "pause mode", *(label for _, label in keys)]
    lines, idle = md_head(head), []
    for _, run in sorted(runs, key=lambda r: r[1].get("serve/backend", "http") != "http"):
        backend = run.get("serve/backend", "http")
        for mode in run.get("serve/modes", []):
            label = mode if backend == "http" else "none: held by the handle"
            if f"serve/refused/{mode}" in run or f"serve/error/{mode}" in run:
                why = "refused by the atomic guard" if f"serve/refused/{mode}" in run else "error"
                lines.append(_row([backend, label, why, *([""] * (len(keys) - 1))]))
                continue
            vals = [run.get(f"{k}/{mode}", "") for k, _ in keys]
            lines.append(_row([backend, label, *(f"{v:.2f}" if isinstance(v, float) else v for v in vals)]))
        idle.append(f"{backend} {run['serve/idle_sync_seconds']:.2f} s")
    ok = all(run["serve/ok"] for _, run in runs)
    return lines + ["", f"Idle sync (no traffic): {', '.join(idle)}; `serve/ok`: {ok}."]


def delta_table(run: dict) -> list[str]:
    head = ["transport", "changed words", "on the wire (of full)", "weight-moving full / delta (s)",
            "end to end full / delta (s)", "delta time (of full), moving / end to end"]
    lines = md_head(head)
    for t in ("colocated", "distributed"):
        if f"bench/delta/wire_ratio/{t}" not in run:
            continue
        g = lambda k: run[f"bench/delta/{k}/{t}"]  # noqa: E731
        lines.append(_row([t, f"{g('changed_fraction'):.1%}", f"{g('wire_ratio'):.1%}",
                           f"{g('seconds/full'):.3f} / {g('seconds/delta'):.3f}",
                           f"{g('end_to_end_seconds/full'):.3f} / {g('end_to_end_seconds/delta'):.3f}",
                           f"{g('time_ratio'):.2f}× / {g('time_ratio_end_to_end'):.2f}×"]))
    lines += ["", f"{run['bench/delta/model_bytes'] / 1e6:.0f} MB in the engine's bfloat16, "
                  f"{run['bench/delta/bucket_bytes'] >> 20} MiB buckets, lr {run['bench/delta/lr']:g}, medians of "
                  f"{run['bench/delta/syncs']} syncs per arm, anchor every {run['bench/delta/anchor_every']}. "
                  f"`bench/delta/verified`: {run['bench/delta/verified']} (every timed sync verified against the "
                  f"trainer's full export; {run['bench/delta/engine_tensors_changed']} of "
                  f"{run['bench/delta/engine_tensors']} engine tensors changed over the run)."]
    return lines


def codec_table(runs: list[tuple[str, dict]]) -> list[str]:
    """`labkit bench codec` runs: a row per device, bucket size and changed fraction (labkit.lab.bench.codec)."""
    head = ["device", "bucket", "changed (encoding)", "payload (of bucket)", "encode (ms)", "decode (ms)",
            "full bucket's copy (ms)", "delta pays on links below"]
    lines, packs = md_head(head), []
    for _, run in runs:
        dev, size = run["bench/codec/device"], f"{run['bench/codec/bucket_bytes'] >> 20} MiB"
        for key in sorted(k.removesuffix("/encoding") for k in run if k.endswith("/encoding")):
            g = lambda k: run[f"{key}/{k}"]  # noqa: E731
            even = g("break_even_gbps")
            lines.append(_row([dev, size, f"{g('changed_fraction'):.1%} ({g('encoding')})", f"{g('payload_ratio'):.1%}",
                               f"{g('encode_seconds') * 1e3:.2f}", f"{g('decode_seconds') * 1e3:.2f}",
                               f"{run['bench/codec/copy_seconds'] * 1e3:.2f}",
                               "any link" if even is None else f"{even:.3g} GB/s"]))
        packs.append(f"{dev}, {size}: {run['bench/pack/tensors']:,} tensors in "
                     f"{run['bench/pack/seconds'] * 1e3:.1f} ms ({run['bench/pack/us_per_tensor']:.1f} µs per tensor)")
    ok = all(r["bench/codec/verified"] for _, r in runs)
    return lines + ["", f"{runs[0][1]['bench/codec/tensors']} destination tensors per bucket, medians of "
                        f"{runs[0][1]['bench/codec/reps']} after a warm-up. `bench/codec/verified`: {ok} in every "
                        "run (each decode reproduced the new bucket bitwise, each encode left the copy equal to "
                        "it, each pack unpacked to its sources). Pack of fp32 expert matrices (96 × 192) into a "
                        "bf16 bucket: " + "; ".join(packs) + "."]


def roofline_table(run: dict) -> list[str]:
    """Published syncs beside the bound of the transport each used (labkit.lab.roofline.published)."""
    head = ["system", "model", "hardware", "mode", "published", "bytes per sync", "bound of its transport",
            "fraction of its limit", "predicted end to end (labkit's CPU overheads)", "source"]
    lines, notes = md_head(head), []
    for i, r in enumerate(run["roofline/published"], start=1):
        moved = "not published" if r["bytes"] is None else f"{r['bytes'] / 1e9:.1f} GB {r['weights']}"
        limit = r["bound"] if r["bound_s"] is None else f"{_secs(r['bound_s'])} ({r['transport']})"
        predicted = f"{_secs(r['predicted_s'])} ({r['buckets']:,} buckets)" if "predicted_s" in r else "–"
        cells = [f"{r['system']} [{i}]", r["model"], r["hardware"], r["mode"], r["published"], moved, limit,
                 f"{r['fraction_of_limit']:.2%}", predicted, r["source"]]
        lines.append(_row([md_cell(c) for c in cells]))  # a pipe would split the cell
        notes.append(f"- [{i}] {r['assumption']}; bound = {r['bound']}.")
    hashed = next((r for r in run["roofline/published"] if "hash_s" in r), None)
    if hashed:  # what the predicted column adds to the bound
        notes.append(f"- Predicted end to end: the bound + two hash passes over each GPU's bytes at "
                     f"{hashed['hash_gbps']:g} GB/s (labkit's checksum, measured on an H100: "
                     "`data/device_check_h100.json`) + the end-to-end overheads of the fit below.")
    return lines + [""] + notes


def _range(model: dict) -> str:
    """The predicted time's range over the stored bench pairs' fits, where there are several."""
    lo, hi = model.get("predicted_s/colocated_range", (None, None))
    return f" [{_secs(lo)}–{_secs(hi)}]" if lo is not None and hi > lo else ""


def roofline_models_table(run: dict) -> list[str]:
    """The shipped real configs: size, tensor count, and each transport's bound at the reference layout."""
    ref = run["roofline/reference"]
    head = ["model", "parameters (MTP)", "tensors (expert)", "bf16 / FP8 GB", "GPUs (engine TP)", "colocated",
            "NVLink broadcast", "single-NIC RDMA broadcast", "all-ranks P2P",
            f"predicted colocated, {ref['bucket_mb']:g} MiB buckets"]
    lines = md_head(head)
    for m in run["roofline/models"]:
        lines.append(_row([m["label"], f"{m['params'] / 1e9:.2f} B ({m['mtp_params'] / 1e9:.2f} B)",
                           f"{m['tensors']:,} ({m['expert_tensors']:,})",
                           f"{m['bf16_bytes'] / 1e9:.1f} / {m['fp8_bytes'] / 1e9:.1f}",
                           f"{m['layout']['engine_gpus']} ({m['layout']['engine_tp']})",
                           *(_secs(m[f"bound_s/{t}"]) for t in ("colocated", "nvlink-broadcast", "rdma-broadcast",
                                                                 "rdma-p2p")),
                           f"{_secs(m['predicted_s/colocated'])}{_range(m)} ({m['buckets']:,} buckets)"]))
    over = run["roofline/overheads"]
    note = (f"{ref['weights']} on {ref['hardware']}, MTP layers included. GPUs: the fewest (a power of two, at "
            f"least 8) whose HBM holds the trainer's state ({ref['trainer_bytes_per_param']} bytes per parameter) in "
            "80 % of it, trainer and engine colocated; engine TP: the fewest holding the weights in half their HBM "
            "(each GPU copies its 1/TP; P2P delivers one copy per replica). NVLink broadcast: as if every receiver "
            "shared the sender's NVLink domain (beyond a node, a floor). Predicted = bound + "
            f"{over.get('per_sync_s', 0.0) * 1e3:.1f} ms per sync + buckets × {over['per_bucket_s'] * 1e3:.2f} ms + "
            f"tensors × {over['per_tensor_s'] * 1e6:.1f} µs: "
            f"{over['measured_on']} ({over['derivation']}).")
    return lines + ["", note + _repeats_note(run.get("roofline/overheads_repeats", []))]


def _repeats_note(reps: list[dict]) -> str:
    if len(reps) < 2:
        return ""

    def span(key: str, scale: float, unit: str) -> str:
        vals = [r[key] * scale for r in reps]
        return f"{min(vals):.1f}–{max(vals):.1f} {unit}"

    return (f" In brackets: the prediction with the overheads fitted from each of the {len(reps)} stored runs of "
            "the bench pair instead (`data/bench_sync_cpu.json` and `data/bench_sync_cpu_<k>.json`, each with its "
            f"MoE run; same commands, same sweep): per tensor {span('per_tensor_s', 1e6, 'µs')}, per sync "
            f"{span('per_sync_s', 1e3, 'ms')}, per bucket {span('per_bucket_s', 1e3, 'ms')}.")


def host_threads_table(run: dict) -> list[str]:
    """scripts/host_threads_ab.py: median seconds per transport of the arm on every core and labkit's default (every
    core but the engine's), transport-only and end to end, the arms interleaved sync by sync."""
    cores, used = run.get("cpu_count") or 1, run.get("threads", {})
    arm_a = next(k for k in run["arms"] if k != "default")
    n = used.get("default")  # recorded by the run; older runs did not say
    default = "default" if n is None else f"{n} thread{'s' if n > 1 else ''} (default)"
    a = f"{used.get(arm_a, run['arms'][arm_a])} threads"
    lines = md_head(["transport", f"transport-only, {a}", f"transport-only, {default}", f"end to end, {a}",
                     f"end to end, {default}"])
    med = run["median_s"]
    for t in dict.fromkeys(k.split("/")[0] for k in med):
        lines.append(_row([t, *(f"{med[f'{t}/{kind}/{arm}']:.3f}" for kind in ("transport_only", "end_to_end")
                                  for arm in (arm_a, "default"))]))
    syncs = len(next(iter(run["samples_s"].values())))
    return [*lines, "", f"Median of {syncs} syncs per arm and transport, {cores} cores."]


def roofline_fit_table(run: dict) -> list[str]:
    """The roofline's overheads, transport-only and end to end, and each fit's residuals: measured less predicted
    seconds on the runs it was fitted on and on runs it never saw."""
    lines = md_head(["measure", "per sync", "per bucket", "per tensor"])
    for m, key in (("transport-only", "roofline/overheads"), ("end to end", "roofline/overheads_end_to_end")):
        o = run[key]
        lines.append(_row([m, f"{o['per_sync_s'] * 1e3:.1f} ms", f"{o['per_bucket_s'] * 1e3:.2f} ms",
                           f"{o['per_tensor_s'] * 1e6:.1f} µs"]))
    lines += ["", *md_head(["measure", "run", "used as", "tensors", "buckets", "measured", "predicted", "residual"])]
    for m, rows in run["roofline/fit_residuals"].items():
        for r in rows:
            residual = round(r["residual_s"] * 1e3, 1) + 0.0  # no "-0.0" for a residual that is 0 by construction
            lines.append(_row([m.replace("_", " ").replace("transport only", "transport-only"), r["run"], r["role"],
                               f"{r['tensors']:,}", r["buckets"], f"{r['measured_s']:.4f} s",
                               f"{r['predicted_s']:.4f} s", f"{residual:+.1f} ms"]))
    return lines
