"""`labkit bench device`: the sync roofline beside the measured syncs, and refit from them.

The roofline (labkit.lab.roofline.bounds) bounds a colocated sync by one HBM copy of the model and predicts it with
overheads measured on the 2-core CPU box. A colocated sync as labkit runs it copies every byte twice (pack into
the flat buffer, then the engine's copy into its parameters), so the refit's model of a warm sync is

    seconds = 2 x bytes / (measured device-copy rate) + buckets x per_bucket + tensors x per_tensor,

fitted on the two models' syncs at the main bucket size (two equations: equal bytes, 12x apart in tensors) and
checked on the same models at the held-out bucket size, which the fit never saw (`refit_error`).
"""

from __future__ import annotations

GB = 1e9


def solve(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(per_bucket, per_tensor) >= 0 from (buckets, tensors, seconds left after the copies) per model: least
    squares, with a term that comes out negative set to 0 and the other refit alone."""
    sbb = sum(b * b for b, _, _ in points)
    stt = sum(t * t for _, t, _ in points)
    sbt = sum(b * t for b, t, _ in points)
    sby = sum(b * y for b, _, y in points)
    sty = sum(t * y for _, t, y in points)
    det = sbb * stt - sbt * sbt
    if det > 0:
        pb, pt = (sby * stt - sty * sbt) / det, (sty * sbb - sby * sbt) / det
        if pb >= 0 and pt >= 0:
            return pb, pt
    pt = max(0.0, sty / stt) if stt else 0.0  # one term alone: the one that explains more
    pb = max(0.0, sby / sbb) if sbb else 0.0
    rest_t = sum((y - t * pt) ** 2 for _, t, y in points)
    rest_b = sum((y - b * pb) ** 2 for b, _, y in points)
    return (0.0, pt) if rest_t <= rest_b else (pb, 0.0)


def refit(m: dict, labels: list[str], variant: str = "") -> None:
    """Overheads from the main bucket size's warm syncs of each model; prediction of the held-out syncs.
    `variant` "serial": the syncs without overlap (`{model}/serial`, `{model}/heldout/serial`)."""
    rate = m.get("device/d2d_gbps")
    v = f"/{variant}" if variant else ""
    out = f"device/refit{v}"
    rows = [f"device/{label}" for label in labels if f"device/{label}{v}/sync_seconds" in m]
    if not rate or len(rows) < 2:
        m[out] = "needs the device copy and both models' syncs"
        return

    def copies(p: str) -> float:
        return 2 * m[f"{p}/bytes"] / (rate * GB)

    points = [(m[f"{p}/buckets"], m[f"{p}/tensors"], m[f"{p}{v}/sync_seconds"] - copies(p)) for p in rows]
    pb, pt = solve(points)
    m[f"{out}/per_bucket_ms"] = round(pb * 1e3, 4)
    m[f"{out}/per_tensor_us"] = round(pt * 1e6, 3)
    m[f"{out}/formula"] = (f"2 x bytes / {rate} GB/s (measured device copy) + buckets x {pb * 1e3:.3f} ms + "
                           f"tensors x {pt * 1e6:.2f} us; fitted on the main bucket size, checked on the held-out one")
    for p in rows:
        h = f"{p}/heldout{v}"
        if f"{h}/sync_seconds" not in m:
            continue
        pred = copies(p) + m[f"{p}/heldout/buckets"] * pb + m[f"{p}/tensors"] * pt
        m[f"{h}/refit_predicted_s"] = round(pred, 4)
        m[f"{h}/refit_error"] = round(pred / m[f"{h}/sync_seconds"] - 1, 3)
        m[f"{p}{v}/refit_predicted_s"] = round(copies(p) + m[f"{p}/buckets"] * pb + m[f"{p}/tensors"] * pt, 4)


def roofline_rows(m: dict, configs: dict[str, dict], bucket_mb: float) -> None:
    """The roofline's colocated bound and prediction (CPU-measured overheads) for each model on this GPU's
    profile, one GPU sending and one receiving, beside the measured warm sync."""
    from labkit.lab.roofline import bounds as rf

    name = m.get("device/name", "")
    hw = next((h for h in ("H200", "H100") if h in name), None)
    if hw is None:
        m["device/roofline"] = f"no roofline profile for {name!r} (H100, H200)"
        return
    over = rf.cpu_overheads()
    one = rf.Layout(trainer_gpus=1, engine_gpus=1, engine_tp=1)
    m["device/roofline/profile"] = f"{hw} ({rf.hardware(hw).hbm_gbps:g} GB/s HBM, spec sheet)"
    for label, cfg in configs.items():
        p = f"device/{label}"
        if f"{p}/sync_seconds" not in m:
            continue
        s = rf.Scenario(model=cfg, mtp=False, hardware=hw, layout=one, bucket_mb=bucket_mb)
        row = rf.transport_rows(s, over)[0]
        m[f"{p}/roofline_bound_s"] = round(row["bound_s"], 5)
        m[f"{p}/roofline_predicted_s"] = round(row["predicted_s"], 5)
        m[f"{p}/roofline_note"] = ("bound: one HBM copy at the spec rate (a sync makes two); predicted: the bound "
                                   "+ overheads measured on the 2-core CPU box")
