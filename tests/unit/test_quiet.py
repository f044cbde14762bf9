"""labkit.compat.quiet: the stack's known CPU-box warnings are hidden by message *and* module, in this process
and in the processes it starts (PYTHONWARNINGS); the same words from another module, any other warning, and
everything under LABKIT_VERBOSE=1 still show (issue 17: 41 of the demo's 140 lines were such warnings)."""

import os
import subprocess
import sys
import warnings

import pytest

from labkit.compat import quiet

TE = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."

# Emits `message` as if from module `name` (warnings' module filter reads the caller's __name__).
CHILD = """
import sys, warnings
for name, message in [a.split("|") for a in sys.argv[1:]]:
    exec("import warnings; warnings.warn(m)", {"__name__": name, "m": message})
"""


def _child(env: dict, *pairs: str) -> str:
    p = subprocess.run([sys.executable, "-c", CHILD, *pairs], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stderr


def test_every_filter_survives_pythonwarnings_syntax():
    for k in quiet.KNOWN:
        assert k.module and k.message and not any(c in k.message + k.module for c in ",:"), k
    for entry in quiet.pythonwarnings().split(","):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Invalid -W option ignored" would raise here
            warnings._setoption(entry)


def test_children_hide_known_warnings_but_not_lookalikes():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", quiet.VERBOSE_ENV)}
    assert quiet.install(env) is True
    err = _child(env, f"megatron.core.optimizer|{TE}", f"someone.else|{TE}",
                 "megatron.core.optimizer|a warning labkit does not know")
    assert err.count(TE) == 1, err  # someone.else's; the known module's is hidden
    assert "a warning labkit does not know" in err
    # The same words from the module labkit knows are gone; from any other module they stay.
    assert _child(env, f"megatron.core.optimizer|{TE}") == ""
    assert TE in _child(env, f"megatron.core.optimizer_fork|{TE}")


def test_a_users_own_pythonwarnings_are_kept_and_win():
    env = {"PYTHONWARNINGS": "error::DeprecationWarning"}
    quiet.install(env)
    quiet.install(env)  # idempotent: the filters are not prepended twice
    assert env["PYTHONWARNINGS"] == quiet.pythonwarnings() + ",error::DeprecationWarning"


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_verbose_shows_everything(value):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env[quiet.VERBOSE_ENV] = value
    assert quiet.install(env) is False and "PYTHONWARNINGS" not in env
    assert TE in _child(env, f"megatron.core.optimizer|{TE}")


def test_in_process_filter_is_precise():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet.install({})
        for name in ("sglang.srt.layers.quantization.gguf", "my.module"):
            exec("import warnings; warnings.warn('Only CUDA, MUSA and NPU support GGUF quantization currently.')",
                 {"__name__": name})
    assert len(seen) == 1 and "GGUF" in str(seen[0].message)
