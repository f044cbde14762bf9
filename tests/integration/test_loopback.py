"""A local run is held to loopback and Ray's token auth is on (issue: an unauthenticated Ray cluster on the
network is the ShadowRay class of attack). Listeners are listed for the driver's whole process tree (Ray's
GCS, raylet, agents and workers; SGLang's scheduler; rendezvous stores) while a sync is held mid-way."""

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from labkit.compat import loopback
from labkit.config import ParallelSpec, TrainConfig
from labkit.sync import SyncConfig, sync
from labkit import failpoints as fp
from tests.integration.conftest import described, restore_model_dir

pytestmark = pytest.mark.integration


def _join(address: str, env: dict) -> subprocess.CompletedProcess:
    """Talk to the GCS the way `ray.init(address=...)` starts (its own client; one call, no retries)."""
    code = (f"from ray._raylet import GcsClient\n"
            f"GcsClient(address={address!r}).internal_kv_keys(b'', namespace=None, timeout=10)\nprint('JOINED')")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_local_ray_refuses_a_client_without_the_token(engine, tmp_path):
    from labkit.cluster import runtime

    info = runtime.init()
    assert info["auth"] == "token" and os.environ.get("RAY_AUTH_TOKEN")
    # Without the token (and no token file in its $HOME) a process on this machine cannot join ...
    stranger = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path)}
    refused = _join(info["address"], stranger)
    assert refused.returncode != 0 and "JOINED" not in refused.stdout
    assert "token" in (refused.stdout + refused.stderr).lower()
    # ... and with it, it can (the control: the refusal above is the token, not a broken address).
    assert "JOINED" in _join(info["address"], dict(os.environ)).stdout


def test_every_listener_is_loopback_while_a_distributed_sync_is_held_mid_way(engine, engine_model_dir):
    from labkit.tasks import arith
    from labkit.trainer.group import Trainer

    info = engine._b.ready()  # the engine actor's pid and SGLang's processes under it
    trainer = Trainer(str(engine_model_dir), ParallelSpec(), TrainConfig(lr=3e-3))
    work = Path(tempfile.mkdtemp(prefix="labkit_listen_"))
    marker, gate = str(work / "marker"), work / "gate"
    gate.touch()
    try:
        trainer.train_step(*arith.batch(arith.problems(8, seed=5)))
        fp.arm_in_actor(trainer.actors[0], "sync.bucket", "wait", nth=2, marker=marker, gate=str(gate), limit_s=120)
        out = {}
        t = threading.Thread(target=lambda: out.update(sync(trainer, engine, SyncConfig(
            transport="distributed", bucket_mb=0.02, progress=False))))
        t.start()
        deadline = time.monotonic() + 120
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.path.exists(marker), "the sync never reached its second bucket"
        found = loopback.listeners()
        gate.unlink()
        t.join(timeout=180)
        assert out.get("sync/verified") is True, out
        names, pids = {x["process"] for x in found}, {x["pid"] for x in found}
        # The listing really covers Ray's servers, the trainer, the engine and SGLang's scheduler (found by pid:
        # the engine's own children, so a process title cannot hide it).
        assert {"gcs_server", "raylet"} <= names and any("TrainerRank" in n for n in names), sorted(names)
        assert info["pid"] in pids and pids & set(info["children"]), (info, described(info["children"]), found)
        assert not loopback.exposed(found), f"listeners not on loopback: {loopback.exposed(found)}"
    finally:
        gate.unlink(missing_ok=True)
        fp.disarm_in_actor(trainer.actors[0]) if trainer.actors else None
        trainer.shutdown()
        restore_model_dir(engine, engine_model_dir)

