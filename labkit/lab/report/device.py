"""The table of `labkit bench device` runs in docs/gpu.md (labkit.lab.device.bench), from data/device_check_*.json.
Runs stored as `..._at_<commit>.json` are earlier code, kept for the figures that cite them, and not tabled."""

from __future__ import annotations

from labkit.lab.report.markdown import md_head
from labkit.lab.report.markdown import md_row as _row

MODELS = ("qwen3-8b", "qwen3-30b-a3b-12l")


def _ms(x) -> str:
    return "–" if x is None else f"{x * 1e3:.1f}"


def _megatron(m: dict) -> str:
    if "device/megatron_export_ok" not in m:
        return "Megatron rank without Ray: not run"
    return (f"Megatron rank without Ray: export synced and verified {m['device/megatron_export_ok']}, bf16 logits vs "
            f"fp32 reference max diff {m.get('device/megatron/logits_max_diff')} (argmax agreement "
            f"{m.get('device/megatron/argmax_agree')})")


def device_table(runs: list[tuple[str, dict]]) -> list[str]:
    head = ["device, bucket", "model (tensors)", "sync (ms)", "GB/s (of device copy)", "pack / apply GB/s",
            "no overlap (ms)", "verified, flip caught, delta", "roofline bound / predicted (ms)",
            "refit: held-out predicted / measured (ms)"]
    lines, notes = md_head(head), []
    for name, m in runs:
        if "_at_" in name:
            continue
        for model in MODELS:
            p = f"device/{model}"
            if f"{p}/sync_seconds" not in m:
                continue
            checks = [m.get(f"{p}/{k}") for k in ("verified", "flip_caught", "delta_verified")]
            held = f"{p}/heldout"
            lines.append(_row([
                f"{m['device/name']}, {m[f'{p}/bucket_bytes'] >> 20} MiB", f"{m[f'{p}/model']} ({m[f'{p}/tensors']:,})",
                _ms(m[f"{p}/sync_seconds"]), f"{m[f'{p}/sync_gbps']:.0f} ({m[f'{p}/vs_d2d']:.2f})",
                f"{m[f'{p}/pack_gbps']:.0f} / {m[f'{p}/apply_gbps']:.0f}", _ms(m.get(f"{p}/serial/sync_seconds")),
                ", ".join("yes" if c is True else str(c) for c in checks),
                f"{_ms(m.get(f'{p}/roofline_bound_s'))} / {_ms(m.get(f'{p}/roofline_predicted_s'))}",
                f"{_ms(m.get(f'{held}/refit_predicted_s'))} / {_ms(m.get(f'{held}/sync_seconds'))} "
                f"({m[f'{held}/bucket_bytes'] >> 20} MiB)"]))
        hz = m.get("device/hazard_params_corrupted", {})
        notes.append(f"`data/{name}`: device copy {m['device/d2d_gbps']:.0f} GB/s (one copy of 4 GiB; "
                     f"{m['device/d2d_rw_gbps']:.0f} counting read and write); refit "
                     f"{m.get('device/refit/per_bucket_ms')} ms per bucket + {m.get('device/refit/per_tensor_us')} µs "
                     "per tensor; ack-before-copy probe: "
                     f"{hz.get('ack_before_copy')} parameters corrupted without the loader's wait, "
                     f"{hz.get('sync_before_ack')} with it; one-rank NCCL group: {m.get('device/nccl_ok')}; "
                     f"{_megatron(m)}; `device/verified` {m['device/verified']}")
    return lines + [""] + notes
