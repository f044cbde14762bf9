"""Bucket-size sweep and autotuner. Pure: both take a `measure(bucket_bytes) -> dict` callable.

Sync time against bucket size is U-shaped on a log axis: tiny buckets pay per-call overhead, huge ones lose
the pack/load overlap and cost memory. The sweep measures log-spaced sizes under the memory budget; the
autotuner runs a discrete golden-section search over the same grid, so it needs about log(n) trials.
"""

from __future__ import annotations

from typing import Callable

from tqdm.auto import tqdm

MB = 1 << 20


def candidates(lo_bytes: int, hi_bytes: int, budget_bytes: int | None = None, per_octave: int = 1) -> list[int]:
    """Log-spaced bucket sizes in [lo, hi], keeping two buckets in flight under the budget."""
    if lo_bytes <= 0 or hi_bytes < lo_bytes:
        raise ValueError(f"lo_bytes={lo_bytes}, hi_bytes={hi_bytes} are invalid: expected 0 < lo <= hi")
    out, x, step = [], float(lo_bytes), 2 ** (1 / per_octave)
    while x <= hi_bytes * 1.0001:
        size = int(round(x))
        if budget_bytes is None or 2 * size <= budget_bytes:
            out.append(size)
        x *= step
    if not out:
        raise ValueError(f"memory budget {budget_bytes} bytes admits no bucket size in [{lo_bytes}, {hi_bytes}]")
    return sorted(set(out))


def sweep(measure: Callable[[int], dict], sizes: list[int], progress: bool = True) -> list[dict]:
    curve = []
    for size in tqdm(sizes, desc="sweep", disable=not progress):
        m = measure(size)
        curve.append({"bucket_bytes": size, "seconds": m["seconds"], "peak_extra_bytes": m.get("peak_extra_bytes")})
    return curve


def autotune(measure: Callable[[int], dict], sizes: list[int], max_trials: int = 6) -> dict:
    """Discrete golden-section search over `sizes` (sorted). Each distinct size is measured once."""
    if max_trials < 1:
        raise ValueError(f"max_trials={max_trials} is invalid: expected >= 1")
    seen: dict[int, dict] = {}

    def f(i: int) -> float:
        if i not in seen:
            seen[i] = measure(sizes[i])
        return seen[i]["seconds"]

    a, b = 0, len(sizes) - 1
    while b - a > 2 and len(seen) < max_trials:
        # Golden-section probes inside [a, b]; measured points are reused, so each step costs <= 1 trial.
        x1 = a + max(1, round(0.381966 * (b - a)))
        x2 = b - max(1, round(0.381966 * (b - a)))
        if x1 >= x2:
            x2 = x1 + 1
        if len(seen) + (x1 not in seen) + (x2 not in seen) > max_trials:
            break
        if f(x1) <= f(x2):
            b = x2
        else:
            a = x1
    for i in sorted(range(a, b + 1), key=lambda i: i in seen):  # spend what is left inside the bracket
        if len(seen) >= max_trials:
            break
        f(i)
    best = min(seen, key=lambda i: seen[i]["seconds"])
    trials = [{"bucket_bytes": sizes[i], "seconds": seen[i]["seconds"],
               "peak_extra_bytes": seen[i].get("peak_extra_bytes")} for i in seen]
    return {"best_bucket_bytes": sizes[best], "best_seconds": seen[best]["seconds"], "trials": trials}


def pick_vs_best(curve: list[dict], bucket_bytes: int) -> float:
    """The sweep's seconds at `bucket_bytes` over the sweep's best: how far a pick (the autotuner's) is from the
    optimum, both read from the same pass, so measurement noise between passes cannot flatter it. 1.0: the best."""
    at = {c["bucket_bytes"]: c["seconds"] for c in curve}
    if bucket_bytes not in at:
        raise ValueError(f"bucket_bytes={bucket_bytes} is not on the swept curve ({sorted(at)})")
    return at[bucket_bytes] / min(at.values())
