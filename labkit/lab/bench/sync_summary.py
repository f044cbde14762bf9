"""The numbers `labkit bench sync` stores, from its timed syncs (labkit.lab.bench.sync) and this box's
references (labkit.lab.bench.reference): per transport the median (what the tables show), the best and every
sample, transport-only and end to end; ratios to the best memcpy of the run; the bound of each transport on this
box and the fraction of it reached (`bench/of_bound/...`: bound / median, 1.0 is the limit)."""

from __future__ import annotations

import statistics


def _key(t: str) -> str:
    return t.replace("-", "_")


def transport_seconds(m: dict) -> float:
    """A sync's wall time less its verification (none on a transport-only sync): setup and the session's calls
    are paid on every warm sync, so they are in (tests/unit/test_tune.py shows a warm sync still pays them)."""
    return m["timing/sync/total"] - m["timing/sync/verify"]


def _phases(m: dict) -> dict:
    return {k.removeprefix("timing/sync/"): round(v, 6) for k, v in m.items() if k.startswith("timing/sync/")}


def _median_sync(ms: list[dict], f) -> dict:
    return sorted(ms, key=f)[(len(ms) - 1) // 2]


def references(rates: list[dict], gloo: dict) -> dict:
    """The best of each rate over the run, with every sample (each measured in the trainer's process)."""
    out = {"bench/reference_process": "trainer rank 0 (Ray actor), between rounds"}
    for k in ("memcpy_gbps", "two_copies_gbps", "hash_gbps"):
        out[f"bench/{k}"] = max(r[k] for r in rates)
        out[f"bench/{k}_samples"] = [r[k] for r in rates]
    out["bench/gloo_gbps"], out["bench/gloo_seconds_samples"] = gloo["gloo_gbps"], gloo["samples_s"]
    return out


def per_transport(t: str, fast: list[dict], full: list[dict], mem: float, nbytes: int) -> dict:
    only = [transport_seconds(m) for m in fast]
    e2e = [m["timing/sync/wall"] for m in full]
    med, k = statistics.median(only), _key(t)
    out = {f"bench/{k}_seconds": round(med, 4), f"bench/{k}_seconds_best": round(min(only), 4),
           f"bench/transport_seconds_all/{t}": [round(v, 4) for v in only],
           f"bench/{k}_gbps": round(nbytes / med / 1e9, 4),
           f"bench/end_to_end_seconds/{t}": round(statistics.median(e2e), 4),
           f"bench/end_to_end_seconds_best/{t}": round(min(e2e), 4),
           f"bench/end_to_end_seconds_all/{t}": [round(v, 4) for v in e2e],
           f"bench/apply_path/{t}": fast[0]["sync/apply_path"],
           f"bench/engine_apply_share/{t}": round(statistics.median(m["timing/sync/load"] / m["timing/sync/wall"]
                                                                    for m in full), 4)}
    if t != "per-tensor":
        out[f"bench/{k}_vs_memcpy"] = round(nbytes / med / 1e9 / mem, 4)
        out[f"bench/{k}_vs_memcpy_end_to_end"] = round(nbytes / statistics.median(e2e) / 1e9 / mem, 4)
    return out


def bounds_of(t: str, out: dict, bound: dict, base: str) -> dict:
    """`base`: the transport whose bytes path arm `t` takes (a peer arm's is its labkit transport's)."""
    if base not in bound["transport_only"]:
        return {}
    only, e2e = bound["transport_only"][base], bound["end_to_end"][base]
    return {f"bench/bound_seconds/{t}": round(only, 4), f"bench/bound_seconds/{t}_end_to_end": round(e2e, 4),
            f"bench/of_bound/{t}": round(only / out[f"bench/{_key(t)}_seconds"], 4),
            f"bench/of_bound/{t}_end_to_end": round(e2e / out[f"bench/end_to_end_seconds/{t}"], 4)}


def summary(fast: dict[str, list[dict]], full: dict[str, list[dict]], rates: list[dict], gloo: dict,
            bounds, peers: dict[str, str] | None = None) -> dict:
    """Everything the bench stores; `bounds(nbytes, rates) -> {"transport_only": {t: s}, "end_to_end": ...}`;
    `peers`: peer arm -> the labkit transport it is compared with (`bench/vs_peer/...`)."""
    peers = peers or {}
    colo = fast["colocated"][0]
    nbytes = colo["sync/bytes"]
    out = references(rates, gloo)
    mem = out["bench/memcpy_gbps"]
    best_rates = {k.removeprefix("bench/"): out[k] for k in ("bench/memcpy_gbps", "bench/two_copies_gbps",
                                                             "bench/hash_gbps", "bench/gloo_gbps")}
    bound = bounds(nbytes, best_rates)
    for t in fast:
        out.update(per_transport(t, fast[t], full[t], mem, nbytes))
        out.update(bounds_of(t, out, bound, peers.get(t, t)))
    bucketed = min(out["bench/colocated_seconds"], out["bench/distributed_seconds"])
    e2e = {t: out[f"bench/end_to_end_seconds/{t}"] for t in fast}
    out.update({
        "bench/model_bytes": nbytes, "bench/num_tensors": colo["sync/num_tensors"],
        "bench/bucket_bytes": colo["sync/bucket_bytes"], "bench/num_buckets": colo["sync/num_buckets"],
        "bench/largest_tensor_bytes": colo["sync/largest_tensor_bytes"],
        "bench/peak_extra_bytes": max(m["sync/peak_extra_bytes"] for t in ("colocated", "distributed")
                                      for m in fast[t]),
        "bench/session_seconds": round(statistics.median(m["timing/sync/session"] for m in fast["colocated"]), 4),
        "bench/apply_path": colo["sync/apply_path"],
        "bench/engine_apply_share": out["bench/engine_apply_share/colocated"],
        "bench/speedup_bucketed_vs_per_tensor": round(out["bench/per_tensor_seconds"] / bucketed, 2),
        "bench/speedup_end_to_end": round(e2e["per-tensor"] / min(e2e["colocated"], e2e["distributed"]), 2),
        "bench/phases": {t: _phases(_median_sync(ms, transport_seconds)) for t, ms in fast.items()},
        "bench/phases_end_to_end": {t: _phases(_median_sync(ms, lambda m: m["timing/sync/wall"]))
                                    | {"wall": round(_median_sync(ms, lambda m: m["timing/sync/wall"])
                                                     ["timing/sync/wall"], 6)} for t, ms in full.items()},
    })
    for peer, t in peers.items():  # the peer's time over labkit's: above 1 when labkit is faster
        if peer in fast and t in fast:
            out[f"bench/vs_peer/{t}"] = round(out[f"bench/{_key(peer)}_seconds"] / out[f"bench/{_key(t)}_seconds"], 3)
            out[f"bench/vs_peer/{t}_end_to_end"] = round(e2e[peer] / e2e[t], 3)
    if "direct" in fast:
        out["bench/speedup_direct_vs_per_tensor"] = round(out["bench/per_tensor_seconds"]
                                                          / out["bench/direct_seconds"], 2)
        out["bench/speedup_end_to_end/direct"] = round(e2e["per-tensor"] / e2e["direct"], 2)
    return out | _memory(fast, out)


def _memory(fast: dict[str, list[dict]], out: dict) -> dict:
    b, big = out["bench/bucket_bytes"], out["bench/largest_tensor_bytes"]
    res = {"bench/peak_within_contract": out["bench/peak_extra_bytes"] <= 2 * b + big}
    # measured by the kernel (labkit.sync.memory) on the transport-only syncs (no guard: its host copy is its own)
    measured = [m.get("sync/peak_extra_bytes_measured") for t in ("colocated", "distributed") for m in fast[t]]
    if measured and None not in measured:
        res["bench/peak_extra_bytes_measured"] = max(measured)
        res["bench/peak_measured_within_contract"] = max(measured) <= 2 * b + big
    return res
