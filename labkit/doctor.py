"""`labkit doctor`: versions, devices and the compat layers this machine needs."""

from __future__ import annotations

import os
import platform

from labkit import compat

PACKAGES = {"torch": "torch", "megatron_core": "megatron-core", "mbridge": "mbridge",
            "transformers": "transformers", "sglang": "sglang", "ray": "ray"}


def _version(dist: str) -> str | None:
    return compat.installed_version(dist)


def report() -> dict:
    import torch

    out = {key: _version(dist) for key, dist in PACKAGES.items()}
    cuda = torch.cuda.is_available()
    layers = compat.planned()
    out.update({
        "python": platform.python_version(),
        "cuda_available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else ["cpu"],
        "cpu_count": os.cpu_count(),
        "compat": layers,
        # The CPU layers patch exact releases: another version is named here, before a run fails on it.
        "compat_problems": [p for d in compat.SUPPORTED if layers and (p := compat.version_problem(d))],
    })
    return out


def format_text(r: dict) -> str:
    lines = [f"{k:<14} {r[k]}" for k in PACKAGES]
    lines += [f"{'python':<14} {r['python']}", f"{'cuda':<14} {r['cuda_available']} {r['devices']}",
              f"{'compat':<14} {', '.join(r['compat']) or 'none (CUDA present)'}"]
    lines += [f"{'problem':<14} {p}" for p in r.get("compat_problems", [])]
    return "\n".join(lines)
