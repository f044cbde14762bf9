"""Compat layers that let the real stack run on a machine without CUDA. Each is switched on only there.

The layers patch call sites of exact SGLang / megatron-core releases, so each checks the installed version
first (`check_version`, read from package metadata, nothing imported) and refuses another one with a message
that names the version found and the supported one, instead of failing somewhere inside a patched call.
"""

from __future__ import annotations

from importlib import metadata

# dist -> (versions the layer was checked against, which layer, what to do otherwise)
SUPPORTED = {
    "sglang": (("0.5.23",), "SGLang layer", "install the pinned version (see requirements.txt)"),
    "megatron-core": (("0.16.1",), "CPU compat layer",
                      "install the pinned version (see requirements.txt) or run on a GPU"),
}


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist` (package metadata; the package is not imported), or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def version_problem(dist: str, version: str | None = None) -> str | None:
    """Why labkit's compat layer for `dist` cannot run with `version` (default: the installed one); None if it can."""
    supported, layer, fix = SUPPORTED[dist]
    version = installed_version(dist) if version is None else version
    if version is None:
        return f"{dist} is not installed; install the pinned stack (requirements.txt)"
    if version not in supported:
        return f"labkit's {layer} was written for {dist} {', '.join(supported)}, found {dist} {version!r}; {fix}"
    return None


def check_version(dist: str, version: str | None = None) -> str:
    """Raise RuntimeError with `version_problem`'s message unless `dist` is a supported version; returns it."""
    problem = version_problem(dist, version)
    if problem:
        raise RuntimeError(problem)
    return installed_version(dist) if version is None else version


def planned() -> list[str]:
    """The compat layers labkit switches on in this environment (empty where CUDA is present)."""
    import torch

    if torch.cuda.is_available():
        return []
    return ["cuda_only_imports", "megatron_cpu", "sglang_cpu", "fp8_cpu", "spec_cpu"]
