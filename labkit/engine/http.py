"""The HTTP backend (a running `sglang.launch_server`), and a launcher for such a server.

Control routes answer `{"success", "message"}` (400 on failure), the same dicts the Ray actor returns.
Tensors cross as SGLang's MultiprocessingSerializer payloads (ForkingPickler, base64 in JSON), so the server
must be on this host; CPU tensors are shared through named files (`file_system` strategy), because with the
default fd strategy the server cannot authenticate to our process and dies. Stdlib urllib only, every
request with a timeout.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

from labkit.cluster import allocator
from labkit.cluster.runtime import free_port
from labkit.compat import cpu_tp
from labkit.compat import sglang as compat
from labkit.engine.actor import MODEL_PACKAGE  # cheap: actor.py imports Ray/SGLang only inside functions
from labkit.engine.errors import EngineError, EngineUnreachable, PortTaken

# torch is imported where a tensor is serialized or a server started: an HTTP client of a running server
# (and `import labkit.engine`) needs no torch.


class HttpBackend:
    def __init__(self, url: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._tp = None

    def with_timeout(self, timeout_s: float) -> HttpBackend:
        b = HttpBackend(self.url, timeout_s)
        b._tp = self._tp
        return b

    def _request(self, method: str, route: str, body=None, timeout=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + route, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:  # SGLang's refusals (400) carry the message in the body
            return e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise EngineUnreachable(f"engine at {self.url} did not answer {route} within "
                                    f"{timeout or self.timeout_s:.0f} s: {getattr(e, 'reason', e)}") from None

    def _json(self, route: str, body=None, method="POST"):
        """Parsed JSON body; a refusal (status >= 400) becomes {"success": False, "message": ...}."""
        status, raw = self._request(method, route, body)
        out = _parse(raw)
        if status >= 400:
            return {"success": False, "message": _message(out) or f"HTTP {status}", "status": status}
        return out

    def _control(self, route: str, body: dict) -> dict:
        out = self._json(route, body)
        if isinstance(out, dict) and "success" in out:
            return {"success": bool(out["success"]), "message": str(out.get("message", ""))}
        # pause/continue answer {"status": "ok", ...}, memory routes answer null: success is the 200
        return {"success": True, "message": _message(out)}

    # --- the backend interface (same names and results as labkit.engine.actor.EngineActor) ------------------
    def generate(self, prompts, input_ids, sampling, return_logprob) -> list[dict]:
        body = {"sampling_params": sampling or {}, "return_logprob": return_logprob}
        body.update({"text": prompts} if prompts is not None else {"input_ids": input_ids})
        out = self._json("/generate", body)
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineError(f"generate failed at {self.url}: {out['message']}")
        return out if isinstance(out, list) else [out]

    def _tp_size(self) -> int:
        if self._tp is None:
            info = self._json("/server_info", method="GET")
            self._tp = int(info.get("tp_size", 1)) if isinstance(info, dict) else 1
        return self._tp

    def custom_weight_loaders(self) -> list[str]:
        info = self._json("/server_info", method="GET")
        return list((info.get("custom_weight_loader") if isinstance(info, dict) else None) or [])

    def begin_weight_update(self, selector="all") -> dict:
        return self._control("/begin_weight_update", {"selector": selector})

    def end_weight_update(self) -> dict:
        return self._control("/end_weight_update", {})

    def update_weights_from_tensor(self, payload, load_format=None, flush_cache=True, weight_version=None) -> dict:
        if payload and isinstance(payload[0], (str, bytes)):  # already one serialized payload per TP rank
            payloads = [p if isinstance(p, str) else base64.b64encode(p).decode() for p in payload]
        else:  # one payload per TP rank, as sglang.Engine sends
            payloads = [serialize(list(payload)) for _ in range(self._tp_size())]
        body = {"serialized_named_tensors": payloads, "load_format": load_format, "flush_cache": flush_cache,
                "weight_version": weight_version}
        return self._control("/update_weights_from_tensor", body)

    def update_weights_from_distributed(self, names, dtypes, shapes, group_name, flush_cache=True,
                                        load_format=None, weight_version=None) -> dict:
        return self._control("/update_weights_from_distributed", {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
            "group_name": group_name, "flush_cache": flush_cache, "load_format": load_format,
            "weight_version": weight_version})

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size, group_name,
                                  backend) -> dict:
        return self._control("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    def destroy_weights_update_group(self, group_name) -> dict:
        return self._control("/destroy_weights_update_group", {"group_name": group_name})

    def set_weight_version(self, version, abort_all_requests=False) -> dict:
        return self._control("/update_weight_version", {"new_version": version,
                                                        "abort_all_requests": abort_all_requests})

    def get_weights_by_name(self, name, truncate_size):
        out = self._json("/get_weights_by_name", {"name": name, "truncate_size": truncate_size})
        return None if isinstance(out, dict) and out.get("success") is False else out

    def model_info(self) -> dict:
        return self._json("/model_info", method="GET")

    def tp_size(self) -> int:
        return self._tp_size()

    def device(self) -> str:
        info = self._json("/server_info", method="GET")
        return str(info.get("device", "cuda")) if isinstance(info, dict) else "cuda"

    def node(self) -> dict:
        """No Ray node id for a server: its URL's host stands for where it runs."""
        return {"node_id": None, "node_ip": urllib.parse.urlsplit(self.url).hostname}

    def check_weights(self, action="checksum") -> dict:
        out = self._json("/weights_checker", {"action": action})
        return {"success": bool(out.get("success")), "message": str(out.get("message", "")),
                "ranks": out.get("ranks")}

    def release_memory_occupation(self, tags=None) -> dict:
        return self._control("/release_memory_occupation", {"tags": tags})

    def resume_memory_occupation(self, tags=None) -> dict:
        return self._control("/resume_memory_occupation", {"tags": tags})

    def flush_cache(self) -> dict:
        status, raw = self._request("POST", "/flush_cache")  # answers plain text
        return {"success": status == 200, "message": _message(_parse(raw))}

    def pause_generation(self, mode="abort") -> dict:
        return self._control("/pause_generation", {"mode": mode})

    def continue_generation(self) -> dict:
        return self._control("/continue_generation", {})

    def health(self, timeout=None) -> bool:
        try:
            return self._request("GET", "/health", timeout=timeout)[0] == 200
        except EngineUnreachable:
            return False


def _parse(raw: bytes):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace").strip()


def _message(out) -> str:
    if isinstance(out, dict):
        err = out.get("error")
        return str(out.get("message") or (err.get("message") if isinstance(err, dict) else err) or "")
    return "" if out is None else str(out)


def serialize(obj) -> str:
    """SGLang's MultiprocessingSerializer.serialize(obj, output_str=True), without importing sglang."""
    from labkit.engine import ipc  # torch: only where a tensor is serialized

    return ipc.dumps_str(obj)


BIND_FAILED = b"error while attempting to bind on address"  # uvicorn's log line; the server process stays up


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None,
                 what: str = "") -> None:
    """Poll GET /health until 200; fail early if `proc` exits or its `log` says it could not bind its port
    (PortTaken: it stays up then); never longer than timeout_s."""
    what = f" for {what}" if what else ""
    backend, deadline = HttpBackend(url, timeout_s), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EngineError(f"SGLang server{what} exited with code {proc.returncode} before {url} became healthy"
                              f"{_log_tail(log)}")
        if log is not None and log.is_file() and BIND_FAILED in log.read_bytes():
            raise PortTaken(f"SGLang server{what} could not bind {url}: address already in use{_log_tail(log, 5)}")
        if backend.health(timeout=min(5.0, max(0.5, deadline - time.monotonic()))):
            return
        time.sleep(0.5)
    raise EngineUnreachable(f"engine{what} at {url} did not become healthy within {timeout_s:.0f} s{_log_tail(log)}")


def _log_tail(log: Path | None, n: int = 40) -> str:
    if log is None or not log.is_file():
        return ""
    lines = log.read_text(errors="replace").splitlines()
    return f"\n--- server log tail ({log}) ---\n" + "\n".join(lines[-n:])


class ServerProcess:
    """A `python -m sglang.launch_server` subprocess in its own session (process group)."""

    def __init__(self, cfg, host: str = "127.0.0.1", port: int | None = None):
        import torch

        compat.check_sglang_version()
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        device = "cuda" if torch.cuda.is_available() else "cpu"
        allocator.install()  # the server and its scheduler hand freed memory back (labkit.cluster.allocator)
        env = compat.env()  # SGLANG_USE_CPU_ENGINE + placeholder first on PYTHONPATH (CPU only)
        env.setdefault("SGLANG_EXTERNAL_MODEL_PACKAGE", MODEL_PACKAGE)
        if device == "cpu":  # TP > 1 ranks bind their threads to cores of their own (labkit.compat.cpu_tp)
            env.update(cpu_tp.launch_env(cfg.tp, env))
        # GET /health as liveness (what the actor backend's health answers), not a one-token generate: a paused
        # server holds that generate, so after a failed atomic sync (generation paused) the guard's health probe
        # waited out the call timeout, read "dead" and restarted a live server (~60 s) instead of restoring it.
        env.setdefault("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "false")
        fd, path = tempfile.mkstemp(prefix="labkit_sglang_server_", suffix=".log")
        self.log = Path(path)
        argv = [sys.executable, "-m", "sglang.launch_server", *cfg.server_argv(device, host, self.port)]
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_healthy(self.url, cfg.start_timeout_s, self.proc, self.log, what=f"model_dir={cfg.model_dir!r}")
        except BaseException:
            self._kill(grace_s=5.0)  # keep the log: the error names it
            raise

    def stop(self, grace_s: float = 15.0) -> list[str]:
        removed = self._kill(grace_s)
        self.log.unlink(missing_ok=True)
        return removed

    def _members(self) -> list:
        """The server and every process still in its session's process group (children of a dead server
        are reparented, so its process tree alone would miss them)."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.pid == self.proc.pid or os.getpgid(p.pid) == self.proc.pid:
                    out.append(p)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        return out

    def _kill(self, grace_s: float) -> list[str]:
        """SIGTERM the server's process group, SIGKILL what is left, reap, remove its /dev/shm leftovers."""
        procs = self._members()
        if procs:
            procs += [c for p in procs for c in _children(p)]  # a child that left the group goes too
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=grace_s if sig == signal.SIGTERM else 10)
            if not alive:
                break
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # Our own torch_<pid>_* files too: tensors we sent it that the SIGKILLed server never released.
        return compat.cleanup_shm(own_pid=os.getpid())


def _children(p) -> list:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
