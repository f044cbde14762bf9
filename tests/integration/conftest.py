"""Session fixtures for the integration tests.

`engine` / `engine_model_dir`: ONE real SGLang engine (in-process `sglang.Engine` inside a Ray actor, on
the local Ray cluster from labkit.cluster.runtime) per test session; starting one costs ~20-40 s on 2 cores.
Teardown checks that shutdown left no SGLang process and no /dev/shm file behind.
"""

import contextlib
import os

import pytest

# vocab 131: not a multiple of 64, so every shared-engine test runs against SGLang's padded vocabulary (192 rows)
ENGINE_SPEC = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=131, seed=0)


def engine_config(model_dir, **kw):
    from labkit.engine import EngineConfig

    # fp32 so weights compare bitwise with the trainer's; a tiny KV cache instead of SGLang's RAM-sized default
    return EngineConfig(**{"model_dir": str(model_dir), "dtype": "float32", "mem_fraction_static": 0.05,
                           "max_total_tokens": 2048, "random_seed": 0, **kw})


@contextlib.contextmanager
def started_engine(model_dir, **kw):
    """An engine of its own for a module (the session's `engine` is shared): started on the local Ray cluster,
    shut down at the end, and checked to have left no process or /dev/shm file behind."""
    from labkit.cluster import runtime
    from labkit.engine import EngineHandle

    runtime.init()
    handle = EngineHandle.start(engine_config(model_dir, **kw))
    info = handle._b.ready()
    try:
        yield handle
    finally:
        handle.shutdown()
    assert not gone_within([info["pid"], *info["children"]]), "engine shutdown left processes"
    assert not shm_leftovers([info["pid"]])


def shm_leftovers(pids=()) -> list[str]:
    """SGLang /dev/shm files (load slots, semaphores) that no live process holds."""
    from labkit.compat import sglang as compat

    held, torch_files = compat._held_paths(), tuple(f"torch_{p}_" for p in (os.getpid(), *pids))
    return sorted(str(f) for f in compat.SHM_DIR.iterdir()
                  if f.name.startswith(compat.SHM_PREFIXES + torch_files) and str(f) not in held)


def restore_model_dir(engine, model_dir) -> None:
    """Put the model directory's weights (and version) back, so the shared engine serves what other tests expect."""
    from safetensors.torch import load_file

    weights = load_file(str(model_dir / "model.safetensors"))
    engine.begin_weight_update()
    engine.update_weights_from_tensor(list(weights.items()))
    engine.end_weight_update()
    engine.set_weight_version("default")


def gone_within(pids, seconds: float = 20.0) -> list[int]:
    """`live(pids)` once they have all exited, or at the end of `seconds` (a killed Ray actor's process exits
    shortly after `ray.kill` returns, while the cluster keeps running)."""
    import time

    deadline = time.monotonic() + seconds
    while (left := live(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def described(pids) -> list[str]:
    """Each pid with its title and parent, so a leak names the process it is, not a number."""
    import psutil

    out = []
    for p in pids:
        try:
            proc = psutil.Process(p)
            out.append(f"{p} {' '.join(proc.cmdline())[:120] or proc.name()} (parent {proc.ppid()})")
        except psutil.NoSuchProcess:
            out.append(f"{p} (gone)")
    return out


def live(pids) -> list[int]:
    import psutil

    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="session")
def engine_model_dir(tmp_path_factory):
    from labkit.config import ModelSpec
    from labkit.models.tiny import make_tiny_mimo

    return make_tiny_mimo(tmp_path_factory.mktemp("engine") / "tiny", ModelSpec(**ENGINE_SPEC))


@pytest.fixture(scope="session")
def engine(engine_model_dir):
    import ray

    from labkit.cluster import runtime
    from labkit.engine import EngineHandle

    started_ray = not ray.is_initialized()
    runtime.init()
    handle = EngineHandle.start(engine_config(engine_model_dir))
    info = handle._b.ready()  # actor pid + SGLang's processes, to check teardown
    try:
        yield handle
    finally:
        try:  # the engine now serving (a test may have had it restarted): its processes are the ones to check
            info = handle._b.ready()
        except Exception:
            pass
        handle.shutdown()
        if started_ray:
            runtime.shutdown()
    left = gone_within([info["pid"], *info["children"]])  # ray.shutdown returns before killed workers exit
    assert not left, f"engine shutdown left processes {described(left)}"
    assert not shm_leftovers([info["pid"]]), f"engine shutdown left {shm_leftovers([info['pid']])}"
