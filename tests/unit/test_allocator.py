"""labkit.cluster.allocator: freed buffers go back to the system, in processes started with its environment and in
a running one after `install`; glibc's defaults keep them (the growth `labkit soak` read as leaks)."""

import os
import subprocess
import sys

import pytest

from labkit.cluster import allocator

if not sys.platform.startswith("linux"):
    pytest.skip("glibc's malloc and /proc: Linux only", allow_module_level=True)

RETAINED = "from labkit.cluster import allocator; {setup}; print(allocator.retained_mb())"


def retained(env: dict, setup: str = "pass") -> float:
    out = subprocess.run([sys.executable, "-c", RETAINED.format(setup=setup)], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return float(out.stdout.split()[-1])


def plain_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in (allocator.ENV, allocator.OPT_OUT)}


def test_glibc_defaults_keep_freed_buffers_and_the_settings_give_them_back():
    assert retained(plain_env()) > 50  # about 100 MB: the pattern reproduces (or this test proves nothing)
    assert retained({**plain_env(), allocator.ENV: allocator.tunables()}) < 20  # a child started with the env
    assert retained(plain_env(), setup="assert allocator.install()") < 20  # this process, by mallopt


def test_install_sets_the_environment_children_inherit_and_yields_to_the_user():
    env = {}
    assert allocator.install(env) in (True, False)  # False only off glibc
    assert env[allocator.ENV] == allocator.tunables()
    mine = {allocator.ENV: "glibc.malloc.arena_max=4"}
    assert allocator.install(mine) is False and mine[allocator.ENV] == "glibc.malloc.arena_max=4"
    out = {allocator.OPT_OUT: "default"}
    assert allocator.install(out) is False and allocator.ENV not in out
