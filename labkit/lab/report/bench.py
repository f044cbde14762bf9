"""The sync bench's tables (docs/sync-speed.md, docs/moe.md; labkit.lab.report.generate): one run of `labkit bench
sync`, and every stored run of the bench pair side by side, so a reader sees how far a ratio moves from run to run
on the same box; and one `labkit sync` of each model family (docs/model-families.md)."""

from __future__ import annotations

import shlex

from labkit.lab.report.markdown import md_head
from labkit.lab.report.markdown import md_row as _row


def bench_table(run: dict) -> list[str]:
    """One `labkit bench sync` run. A run that stored this box's bounds (`bench/bound_seconds/...`) shows the
    medians of its interleaved rounds and the fraction of each bound reached; an older run shows what it stored
    (its best syncs, no bound), and says so."""
    bounded = any(k.startswith("bench/bound_seconds/") for k in run)
    head = ["transport", "transport-only (s)", "GB/s", "of a memcpy", *(["of this box's bound"] if bounded else []),
            "end to end (s)", *(["of its bound"] if bounded else []), "engine apply"]
    lines = md_head(head)
    transports = [t for t in ("per-tensor", "colocated", "distributed", "direct", "peer-colocated", "peer-distributed")
                  if f"bench/{t.replace('-', '_')}_seconds" in run]
    for t in transports:
        key = t.replace("-", "_")
        apply = run.get(f"bench/apply_path/{t}", run["bench/apply_path"] if t == "colocated" else "load_weights")
        bound = [f"{run[f'bench/of_bound/{t}']:.2f}"] if bounded else []
        bound_e2e = [f"{run[f'bench/of_bound/{t}_end_to_end']:.2f}"] if bounded else []
        lines.append(_row([t, f"{run[f'bench/{key}_seconds']:.3f}", f"{run[f'bench/{key}_gbps']:.2f}",
                           f"{run.get(f'bench/{key}_vs_memcpy', 0):.3f}" if t != "per-tensor" else "", *bound,
                           f"{run[f'bench/end_to_end_seconds/{t}']:.3f}", *bound_e2e, apply]))
    if bounded:
        lines += ["", f"Medians of {len(run['bench/transport_seconds_all/colocated'])} interleaved rounds (order "
                      "rotated each round; best and every sample in the file). Transport-only: a warm sync without "
                      "verification or the atomic guard, setup and session calls included, each checked against "
                      f"the export afterwards (`bench/transport_only_verified`: "
                      f"{run['bench/transport_only_verified']}). This box, measured in the trainer's process in the "
                      f"same run: memcpy {run['bench/memcpy_gbps']:.1f} GB/s, two concurrent one-thread copies "
                      f"{run['bench/two_copies_gbps']:.1f} GB/s each, hash {run['bench/hash_gbps']:.1f} GB/s, gloo "
                      f"loopback {run['bench/gloo_gbps']:.1f} GB/s; a bound is the time those rates allow "
                      "(labkit.lab.bench.reference), 1.00 would be at it."]
        peers = [t for t in ("colocated", "distributed") if f"bench/vs_peer/{t}" in run]
        if peers:
            lines[-1] += (" Peer arms: SGLang's stock update path, as verl (PR #2418) and slime ship it (flattened "
                          "buckets, one engine call each, the model's `load_weights`; `SyncConfig.engine_loader="
                          "\"sglang\"`), in the same rounds; end to end they run under the same guard and "
                          "verification as labkit's. labkit over the peer (its time / labkit's): " + "; ".join(
                              f"{t} **{run[f'bench/vs_peer/{t}']:.2f}×** transport-only, "
                              f"**{run[f'bench/vs_peer/{t}_end_to_end']:.2f}×** end to end" for t in peers) + ".")
    else:
        lines += ["", "Best of the run's syncs per transport; this run stored no bounds and timed transport-only as "
                      "total less verification, setup and session (a definition labkit no longer uses)."]
    lines += [f"{run['bench/model_bytes'] / 1e6:.0f} MB, {run['bench/num_tensors']} tensors, "
                  f"{run['bench/bucket_bytes'] >> 20} MiB buckets; memcpy {run['bench/memcpy_gbps']:.1f} GB/s "
                  "(every core; a two-copy path is bounded well below it: "
                  "[What bounds these ratios](sync-speed.md#what-bounds-these-ratios)). "
                  f"Bucketed vs per-tensor: **{run['bench/speedup_bucketed_vs_per_tensor']:.1f}×** transport-only, "
                  f"**{run['bench/speedup_end_to_end']:.1f}×** end to end"
                  + (f"; direct vs per-tensor: **{run['bench/speedup_direct_vs_per_tensor']:.1f}×** transport-only, "
                     f"**{run['bench/speedup_end_to_end/direct']:.1f}×** end to end"
                     if "bench/speedup_direct_vs_per_tensor" in run else "") + ". `bench/verified`: "
                  f"{run['bench/verified']} ({run['bench/engine_tensors_changed']} of {run['bench/engine_tensors']} "
                  f"engine tensors changed over the run)."]
    if "bench/peak_extra_bytes_measured" in run:
        lines[-1] += (f" Extra memory of a bucketed sync: {run['bench/peak_extra_bytes'] / 1e6:.0f} MB planned, "
                      f"{run['bench/peak_extra_bytes_measured'] / 1e6:.0f} MB measured (the kernel's resident "
                      f"high-water mark), against a contract of 2 × bucket + largest tensor = "
                      f"{(2 * run['bench/bucket_bytes'] + run['bench/largest_tensor_bytes']) / 1e6:.0f} MB.")
    if "bench/engine_apply_share" in run:
        lines[-1] += (" Share of an end-to-end sync spent in the engine's apply call (direct: the trainer's writes "
                      "into the engine's parameters): " + ", ".join(
            f"{t} {run[f'bench/engine_apply_share/{t}']:.0%}" for t in transports) + ".")
    return lines + e2e_phase_table(run)


E2E_PHASES = ("gather", "pack", "load", "verify", "stage", "guard", "session")


def e2e_phase_table(run: dict) -> list[str]:
    """Where the fastest end-to-end sync of each transport spent its time (`bench/phases_end_to_end`)."""
    phases = run.get("bench/phases_end_to_end")
    if not phases:
        return []
    head = ["end to end, by phase (s)", *E2E_PHASES, "waited"]
    lines = ["", *md_head(head)]
    for t, p in phases.items():
        lines.append(_row([t, *(f"{p.get(k, 0.0):.3f}" for k in E2E_PHASES), f"{p['wall']:.3f}"]))
    lines += ["", "Phases overlap (the next bucket's gather and pack run while the engine loads this one; the "
                  "checksums of what was sent are hashed between packs, under `verify`), so a row does not add up "
                  "to what was waited; `guard` is the atomic guard's own calls (the engine's checksums before the "
                  "sync, pause, promote, resume)."]
    return lines


REPEATED = (  # (label, value from the pair (bench model run, MoE run), format)
    ("memcpy reference (GB/s)", lambda d, m: d["bench/memcpy_gbps"], "{:.1f}"),
    ("colocated, transport-only, of a memcpy", lambda d, m: d["bench/colocated_vs_memcpy"], "{:.3f}"),
    ("colocated, end to end, of a memcpy", lambda d, m: d["bench/colocated_vs_memcpy_end_to_end"], "{:.3f}"),
    ("direct, transport-only, of a memcpy", lambda d, m: d["bench/direct_vs_memcpy"], "{:.3f}"),
    ("direct, end to end, of a memcpy", lambda d, m: d["bench/direct_vs_memcpy_end_to_end"], "{:.3f}"),
    ("distributed, transport-only, of a memcpy", lambda d, m: d["bench/distributed_vs_memcpy"], "{:.3f}"),
    ("colocated GB/s", lambda d, m: d["bench/colocated_gbps"], "{:.2f}"),
    ("bucketed vs per-tensor, end to end", lambda d, m: d["bench/speedup_end_to_end"], "{:.1f}×"),
    ("MoE preset's colocated GB/s, of the bench model's", lambda d, m: m["bench/colocated_gbps"]
     / d["bench/colocated_gbps"], "{:.2f}"),
    ("`bench/verified` (both models)", lambda d, m: d["bench/verified"] and m["bench/verified"], "{}"),
)


def repeats_table(pairs: list[tuple[dict, dict]]) -> list[str]:
    """Each stored run of the bench pair (bench model, MoE preset), one column per run, with the range."""
    head = ["metric", *(f"run {k}" for k in range(1, len(pairs) + 1)), "range"]
    lines = md_head(head)
    for label, value, fmt in REPEATED:
        vals = [value(d, m) for d, m in pairs]
        spread = "" if isinstance(vals[0], bool) else f"{fmt.format(min(vals))}–{fmt.format(max(vals))}"
        lines.append(_row([label, *(fmt.format(v) for v in vals), spread]))
    return lines + ["", f"{len(pairs)} runs of each bench, one after another on the same box, by the same "
                        "commands. Every ratio is to that run's own memcpy reference (the fastest of the "
                        "samples it took: in the trainer's process between rounds, or for runs stored before that, "
                        "in the driver after each transport); the MoE ratio pairs each bench-model run with the "
                        "MoE run made after it."]


def family_syncs_table(runs: list[tuple[str, dict]]) -> list[str]:
    """`labkit sync --model <preset> --out data/sync_<preset>_cpu.json` runs: what one sync of each family carries
    and whether it landed bitwise, as a user first meets it (a fresh engine: not a speed figure)."""
    head = ["model", "trainer tensors", "MB", "buckets", "engine tensors verified", "engine apply", "verified",
            "greedy = trainer", "first sync (s)"]
    lines = md_head(head)
    for file, run in runs:
        missing = len(run.get("verify/missing", [])) + len(run.get("verify/mismatched", []))
        lines.append(_row([_model(run.get("command", ""), file), f"{run['sync/num_tensors']:,}",
                           f"{run['sync/bytes'] / 1e6:.1f}", run["sync/num_buckets"],
                           f"{run.get('verify/num_checked', 0):,}" + (f" ({missing} wrong)" if missing else ""),
                           run["sync/apply_path"], run["sync/verified"],
                           f"{run.get('rollout/greedy_match_frac', 0):.0%}", f"{run['timing/sync/total']:.2f}"]))
    return lines + ["", "Each: `labkit sync --model <preset> --transport colocated`: three training steps, one "
                        "sync into a fresh SGLang CPU engine (atomic guard, checksum verification of every engine "
                        "tensor against the trainer's export), then greedy generations of engine and trainer "
                        "compared. The first sync of an engine sets up its plan, buffers and engine contract: "
                        "`labkit bench sync` times warm syncs."]


def resharding_table(runs: list[tuple[str, dict]]) -> list[str]:
    """`labkit sync --tp/--pp ... --engine-tp 2 --out data/reshard_*_cpu.json` runs: a trainer layout into an engine
    sharded differently, each rank verified against its own piece of the export."""
    head = ["trainer", "engine TP", "transport", "engine parameters verified (all ranks)", "engine apply", "verified",
            "greedy = trainer", "first sync (s)"]
    lines = md_head(head)
    for _, run in sorted(runs, key=lambda r: (_layout(r[1].get("command", "")), r[1]["sync/transport"])):
        missing = len(run.get("verify/missing", [])) + len(run.get("verify/mismatched", []))
        lines.append(_row([_layout(run.get("command", "")), run.get("sync/engine_tp", 1), run["sync/transport"],
                           f"{run.get('verify/num_checked', 0):,}" + (f" ({missing} wrong)" if missing else ""),
                           run["sync/apply_path"], run["sync/verified"],
                           f"{run.get('rollout/greedy_match_frac', 0):.0%}", f"{run['timing/sync/total']:.2f}"]))
    return lines + ["", "Each: `labkit sync` with the trainer layout and `--engine-tp` shown: three training steps of "
                        "the shipped tiny MiMo, one sync into a fresh SGLang CPU engine at that TP (atomic guard; each "
                        "rank's checksums against its own piece of the export), then greedy generations of engine and "
                        "trainer compared. Two engine ranks on this 2-core box: a correctness run, not a speed figure."]


def _layout(command: str) -> str:
    """The trainer layout a stored `labkit sync` run names: `TP t PP p` (EP when given)."""
    words = shlex.split(command)
    flag = {k: w for k, w in zip(words, words[1:]) if k in ("--tp", "--pp", "--ep")}
    out = f"TP {flag.get('--tp', 1)} PP {flag.get('--pp', 1)}"
    return out + (f" EP {flag['--ep']}" if "--ep" in flag else "")


def _model(command: str, file: str) -> str:
    """The preset a stored `labkit sync` run names (`--model X`, with its `--engine-dtype` when given), else its
    file name."""
    words = shlex.split(command)
    flag = dict(zip(words, words[1:]))
    return flag.get("--model", file) + (f" ({flag['--engine-dtype']} engine)" if "--engine-dtype" in flag else "")
