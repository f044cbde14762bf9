"""labkit.sync.atomic.Guard: a restore pauses the engine in the failed sync's own pause mode. Under "retract" the
sync moved running requests back to the waiting queue to wait for the new weights; a restore that paused with
SGLang's default ("abort") refused every one of them (found by `labkit soak`)."""

import pytest

from labkit.sync import lastgood
from labkit.sync.atomic import Guard
from labkit.sync.config import SyncConfig


class Engine:
    """What a restore calls when the failed sync left the weights as they were."""

    def __init__(self):
        self.modes, self.version, self.cfg = [], "v1", None

    def pause_generation(self, mode="abort"):
        self.modes.append(mode)

    def end_weight_update(self):
        pass

    def destroy_weights_update_group(self, name):
        pass

    def checksums(self):
        return {"w": "h"}

    def set_weight_version(self, v):
        self.version = v

    def continue_generation(self):
        pass

    def health(self):
        return True

    def portable(self, call_timeout_s=None):
        return self


@pytest.mark.parametrize("mode", ["abort", "retract"])
def test_a_failed_sync_is_restored_under_its_own_pause_mode(mode, tmp_path):
    engine, store = Engine(), lastgood.Store(str(tmp_path))
    try:
        guard = Guard(engine, store=store)
        err = guard._fail(RuntimeError("boom"), {"w": "h"}, "v1", "v2", "float32", 0.1, SyncConfig(pause_mode=mode))
    finally:
        store.close()
    assert err.metrics["sync/restored"] is True and engine.version == "v1"
    assert engine.modes == [mode]
