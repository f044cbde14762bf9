"""A launched SGLang server whose port was taken before it bound: uvicorn logs the bind error and the process stays
up. The start says so at once (PortTaken) instead of waiting out its timeout, and launch_server picks another port."""

import subprocess
import sys
import time

import pytest

from labkit.cluster.runtime import free_port
from labkit.engine import http, lifecycle
from labkit.engine.errors import PortTaken

LINE = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): address already in use"
BIND = f"import time; print({LINE!r}, flush=True); time.sleep(60)"


def test_a_server_that_could_not_bind_fails_its_start_at_once(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as out:  # a process that logs uvicorn's bind error and stays up, as the server does
        proc = subprocess.Popen([sys.executable, "-c", BIND], stdout=out, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        with pytest.raises(PortTaken, match="address already in use"):
            http.wait_healthy(f"http://127.0.0.1:{free_port()}", 120.0, proc, log)
        assert time.monotonic() - t0 < 30  # not the 120 s timeout
    finally:
        proc.kill()
        proc.wait()


def test_launch_server_picks_another_port_when_its_pick_was_taken(monkeypatch):
    tried = []

    class Server:
        def __init__(self, cfg, port=None):
            tried.append(port)
            if len(tried) < 3:
                raise PortTaken("taken")
            self.url = "http://127.0.0.1:1"

    monkeypatch.setattr(lifecycle, "ServerProcess", Server)
    monkeypatch.setattr(lifecycle, "check_startable", lambda cfg: None)
    cfg = lifecycle.EngineConfig(model_dir="data/tiny-mimo")
    lifecycle.launch_server(cfg)
    assert tried == [None, None, None]
    tried.clear()
    with pytest.raises(PortTaken):  # a port the caller named is not swapped for another
        lifecycle.launch_server(cfg, port=1234)
    assert tried == [1234]
