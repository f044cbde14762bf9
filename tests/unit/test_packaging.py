"""pyproject.toml declares ranges; requirements.txt / environment.yml pin. Every pin must sit inside its range, or
`pip install -e .[stack]` and `make install` would describe two different stacks."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _pins(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(?:- )?([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s#]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_every_pin_is_inside_the_declared_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for group in project["optional-dependencies"].values() for r in group]
    reqs += [Requirement(r) for r in project["dependencies"]]
    ranges = {r.name.lower(): r.specifier for r in reqs if r.name != "labkit"}
    for source in ("requirements.txt", "environment.yml"):
        pins = _pins((ROOT / source).read_text())
        assert {"torch", "sglang", "megatron-core", "mbridge", "ray"} <= set(pins), source
        for name, version in pins.items():
            assert name in ranges, f"{source} pins {name} but pyproject.toml declares no range for it"
            assert ranges[name].contains(version), f"{source}: {name}=={version} outside {ranges[name]}"


def test_light_dependencies_hold_no_heavy_stack():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    heavy = {"torch", "sglang", "megatron-core", "mbridge", "ray", "transformers"}
    assert not heavy & {Requirement(d).name for d in deps}  # `pip install -e .` never pulls a second torch
