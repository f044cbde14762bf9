"""Starting an engine, and starting it again: the backends EngineHandle wraps (Ray actor, launched HTTP server,
connected URL), each start bounded and each failure named.

Apart from labkit.engine.handle so the handle reads as the calls it offers. Ray is imported where an actor is
started, so importing labkit.engine stays cheap.
"""

from __future__ import annotations

from labkit.cluster import runtime
from labkit.compat import cpu_tp
from labkit.engine.actor import ActorBackend, remote_class
from labkit.engine.config import EngineConfig
from labkit.engine.errors import EngineError, EngineUnreachable, PortTaken, Unsupported
from labkit.engine.http import HttpBackend, ServerProcess
from labkit.models import hf


def check_model_dir(model_dir: str) -> None:
    """Fail before starting anything when the directory cannot be an HF model directory with weights, or holds a
    family variant labkit cannot serve (labkit.models.hf.check_model_dir and check_family, raised as EngineError)."""
    try:
        config = hf.check_model_dir(model_dir, weights=True)
        hf.check_family(config, f"{model_dir}/config.json")
    except (OSError, ValueError) as e:
        raise EngineError(str(e)) from None


def cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def check_quantized_dtype(cfg: EngineConfig) -> None:
    """A block-FP8 checkpoint serves with bf16 or fp16 activations: SGLang refuses float32 for it deep inside
    its loader (`model_loader/loader.py:266-272`), after the engine's processes started. Refused here, naming
    the fix; `auto` reads the checkpoint's own dtype (bfloat16 for labkit's FP8 checkpoints)."""
    config = hf.check_model_dir(cfg.model_dir)
    quant = (config.get("quantization_config") or {}).get("quant_method")
    dtype = config.get("torch_dtype", "bfloat16") if cfg.dtype == "auto" else cfg.dtype
    if quant and dtype == "float32":
        raise Unsupported(f"EngineConfig.dtype={cfg.dtype!r}: model_dir={cfg.model_dir!r} is quantized "
                          f"({quant}), which serves with bfloat16 or float16 activations, not float32; use "
                          "dtype='bfloat16'")


def check_startable(cfg: EngineConfig) -> None:
    """Refuse, before any process starts, what a CPU engine cannot run (it would crash or hang SGLang)."""
    check_model_dir(cfg.model_dir)
    check_quantized_dtype(cfg)
    if cfg.tp > 1 and cpu():  # each rank binds its threads to cores of its own (labkit.compat.cpu_tp)
        try:
            cpu_tp.threads_bind(cfg.tp)
        except ValueError as e:
            raise Unsupported(f"EngineConfig.tp={cfg.tp}: {e}") from None


def start_actor(cfg: EngineConfig, scheduling_strategy=None) -> tuple[ActorBackend, object]:
    """An SGLang Engine in a fresh Ray actor, ready (or EngineError naming why, the actor gone)."""
    check_startable(cfg)
    import ray

    runtime.init()
    opts = {**runtime.ACTOR_OPTIONS, **({"scheduling_strategy": scheduling_strategy} if scheduling_strategy else {})}
    actor = remote_class(num_gpus=0 if cpu() else cfg.tp).options(**opts).remote(cfg)
    backend = ActorBackend(actor, cfg.call_timeout_s)
    try:
        info = ray.get(actor.ready.remote(), timeout=cfg.start_timeout_s)
    except ray.exceptions.GetTimeoutError:
        backend.shutdown()
        raise EngineError(f"SGLang engine for model_dir={cfg.model_dir!r} did not start within "
                          f"{cfg.start_timeout_s:.0f} s") from None
    except ray.exceptions.RayError as e:  # the actor process died (e.g. killed while loading)
        backend.shutdown()
        raise EngineError(f"SGLang engine actor for model_dir={cfg.model_dir!r} died while starting: "
                          f"{root_cause(e)}") from None
    if "error" in info:
        backend.shutdown()
        raise EngineError(f"SGLang could not start an engine for model_dir={cfg.model_dir!r}: {info['error']}")
    return backend, actor


def launch_server(cfg: EngineConfig, port: int | None = None) -> tuple[HttpBackend, ServerProcess]:
    """An SGLang HTTP server subprocess (127.0.0.1) and a backend talking to it."""
    check_startable(cfg)
    for attempt in range(3):  # a port labkit picked can be taken before the server binds it: pick another
        try:
            server = ServerProcess(cfg, port=port)
            break
        except PortTaken:
            if port is not None or attempt == 2:
                raise
    return HttpBackend(server.url, cfg.call_timeout_s), server


def restart_server(server: ServerProcess, cfg: EngineConfig) -> tuple[HttpBackend, ServerProcess]:
    """Stop a launched server and start a fresh one, on the same port if it is free again (else a new one)."""
    port = server.port
    server.stop(grace_s=2.0)
    try:
        server = ServerProcess(cfg, port=port)
    except EngineError:
        server = ServerProcess(cfg)
    return HttpBackend(server.url, cfg.call_timeout_s), server


def connect_backend(url: str, cfg: EngineConfig) -> HttpBackend:
    """A backend for a server someone else runs; EngineUnreachable unless GET /health answers 200 in time."""
    backend = HttpBackend(url, cfg.call_timeout_s)
    wait = min(10.0, cfg.call_timeout_s)
    if not backend.health(timeout=wait):
        raise EngineUnreachable(f"engine at {url} did not answer GET /health (with 200) within {wait:.0f} s")
    return backend


def root_cause(e: Exception) -> str:
    """The last line of the innermost traceback Ray carries (SGLang's own message), plus its type."""
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" ")]
    return lines[-1] if lines else text[-2000:]
