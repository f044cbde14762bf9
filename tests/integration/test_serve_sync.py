"""Atomic syncs while an SGLang HTTP server serves a steady stream of greedy requests (labkit.lab.bench.serve):
no response mixes weight versions, none fails, and requests really were in flight during the syncs."""

import pytest

from labkit.lab.bench import serve as sb

pytestmark = pytest.mark.integration


def test_requests_during_syncs_wait_and_never_mix_versions():
    """abort mode on the HTTP server; retract runs there in the soak, under hundreds of syncs (test_soak.py)."""
    cfg = sb.ServeBenchConfig(modes=("abort",), syncs=1, clients=3, max_requests=40, max_seconds=45)
    out = sb.run(cfg, progress=False)
    print({k: v for k, v in out.items() if k != "serve/definitions"})
    assert out["serve/prompts_changed_total"] > 0, "syncs that change no greedy output test nothing"
    for mode in cfg.modes:
        assert f"serve/error/{mode}" not in out, out[f"serve/error/{mode}"]
        assert out[f"serve/in_flight_during_sync/{mode}"] > 0, f"{mode}: no request overlapped a sync"
        assert out[f"serve/mixed_responses/{mode}"] == 0
        assert out[f"serve/failed/{mode}"] == 0, out[f"serve/errors/{mode}"]
        assert out[f"serve/sync_failed/{mode}"] == 0, out[f"serve/errors/{mode}"]
        assert out[f"serve/requests/{mode}"] == (out[f"serve/ok_responses/{mode}"] + out[f"serve/spanned/{mode}"]
                                                 + out[f"serve/aborted/{mode}"])
    assert out["serve/ok"] is True


def test_the_ray_actor_backend_holds_requests_during_syncs_too():
    """Workbench's default engine: a request that arrives mid-sync waits for the new weights (it used to fail
    with "generation is paused", about 3 in 10 under a steady stream)."""
    cfg = sb.ServeBenchConfig(backend="actor", modes=("abort",), syncs=2, clients=3, max_requests=40,
                              max_seconds=45)
    out = sb.run(cfg, progress=False)
    print({k: v for k, v in out.items() if k != "serve/definitions"})
    assert out["serve/in_flight_during_sync/abort"] > 0, "no request overlapped a sync"
    assert out["serve/failed/abort"] == 0, out["serve/errors/abort"]
    assert out["serve/mixed_responses/abort"] == 0 and out["serve/sync_failed/abort"] == 0
    assert out["serve/ok"] is True and out["serve/backend"] == "actor"
