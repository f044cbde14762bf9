"""`labkit doctor`: versions, devices and the compat layers this machine needs."""

from __future__ import annotations

import platform
from importlib import metadata

PACKAGES = {"torch": "torch", "megatron_core": "megatron-core", "mbridge": "mbridge",
            "transformers": "transformers", "sglang": "sglang", "ray": "ray"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def report() -> dict:
    import torch

    from labkit import compat

    out = {key: _version(dist) for key, dist in PACKAGES.items()}
    cuda = torch.cuda.is_available()
    out.update({
        "python": platform.python_version(),
        "cuda_available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else ["cpu"],
        "cpu_count": __import__("os").cpu_count(),
        "compat": compat.planned(),
    })
    return out


def format_text(r: dict) -> str:
    lines = [f"{k:<14} {r[k]}" for k in PACKAGES]
    lines += [f"{'python':<14} {r['python']}", f"{'cuda':<14} {r['cuda_available']} {r['devices']}",
              f"{'compat':<14} {', '.join(r['compat']) or 'none (CUDA present)'}"]
    return "\n".join(lines)
