"""The in-process backend: a real `sglang.Engine` hosted by a Ray actor.

The actor process is where SGLang gets imported, so the CPU compat layer and the model-package hook are
applied in `__init__` before the first `import sglang` (SGLang's scheduler/detokenizer subprocesses inherit
both through the environment). Methods answer plain data: control calls a `{"success", "message"}` dict,
like the HTTP server's JSON, so the handle treats both backends alike.
"""

from __future__ import annotations

import functools
import os
import threading
import time

from labkit.engine.tee import StderrTee

MODEL_PACKAGE = "labkit.engine.sglang_models"
GENERATE_GROUP, GENERATE_THREADS = "generate", 8  # generate calls the actor runs or holds at once (then queued)


def _ok(res) -> dict:
    """SGLang answers (success, message) tuples or *ReqOutput structs; normalize to a dict."""
    if isinstance(res, tuple):
        return {"success": bool(res[0]), "message": str(res[1]) if len(res) > 1 else ""}
    if hasattr(res, "success"):
        return {"success": bool(res.success), "message": str(getattr(res, "message", "") or "")}
    return {"success": True, "message": "" if res is None else str(res)}


class _LaunchFailed(RuntimeError):
    pass


def _launch_sigquit(signum, frame):
    """SGLang's children SIGQUIT their parent when they fail during launch. SGLang's default handler then
    kills this whole process, so a Ray actor would die without saying why; we raise instead, which aborts
    Engine.__init__ where it waits, and report the child's traceback. (Module-level: ServerArgs is pickled
    to the children. Once serving, SGLang's tokenizer manager installs its own handler.)"""
    raise _LaunchFailed("an SGLang subprocess failed during engine launch (SIGQUIT)")


def _serial(method):
    """Only one thread drives SGLang's event loop at a time (asyncio loops are not thread-safe)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class EngineActor:
    """Wrapped with `ray.remote` by `remote_class()` so that importing this module does not import Ray.

    A failed start does not raise from __init__ (Ray would bury SGLang's message in its own): `ready()`
    answers {"error": ...} and the handle kills the actor.

    Threaded (remote_class) so that a generate waiting out a pause does not block the call that continues
    it: while generation is paused for a weight update, generate waits for continue_generation (bounded)
    instead of refusing, as an SGLang HTTP server holds requests. Every call that touches the engine holds
    `_lock` and generate checks the pause under it, so no request enters SGLang while paused.
    """

    def __init__(self, cfg):
        from labkit.compat import sglang as compat

        self.cfg, self.engine, self.error, self._closed, self._paused = cfg, None, None, False, False
        self._lock, self._resumed = threading.RLock(), threading.Event()
        self._resumed.set()
        self.layers = compat.apply()
        # SGLang's registry serves our MiMo (adds get_weights_by_name) and loads its own zoo on demand.
        os.environ.setdefault("SGLANG_EXTERNAL_MODEL_PACKAGE", MODEL_PACKAGE)
        self._tee = StderrTee()
        try:
            import sglang
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.engine = sglang.Engine(**cfg.sglang_kwargs(device), custom_sigquit_handler=_launch_sigquit)
            self._run(self._start_handle_loop())  # in __init__'s thread, not a worker thread (signal handlers)
        except BaseException as e:  # incl. _LaunchFailed raised from the signal handler
            import time

            time.sleep(0.5)  # let the pump take the child's last lines
            self.error = f"{type(e).__name__}: {e}\n--- SGLang's error ---\n{self._tee.root_cause()}"
            self._kill_children()

    def ready(self) -> dict:
        if self.error is not None:
            return {"error": self.error, "pid": os.getpid()}
        return {"pid": os.getpid(), "compat": self.layers, "children": self._children()}

    def _kill_children(self) -> None:
        import psutil

        procs = psutil.Process().children(recursive=True)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)

    def _children(self) -> list[int]:
        import psutil

        return [p.pid for p in psutil.Process().children(recursive=True)]

    async def _start_handle_loop(self):
        self.engine.tokenizer_manager.auto_create_handle_loop()

    def _run(self, coro):
        # Engine's own methods do exactly this; we need it for requests Engine has no method for
        # (or whose Engine method drops a field such as weight_version).
        return self.engine.loop.run_until_complete(coro)

    # --- generation -------------------------------------------------------------------------------------
    def generate(self, prompts, input_ids, sampling, return_logprob) -> list[dict]:
        """Waits while paused, at most 0.9 x call_timeout_s: the caller then hears "still paused" (the
        handle raises EngineError) rather than a bare timeout."""
        limit = 0.9 * self.cfg.call_timeout_s
        deadline = time.monotonic() + limit
        while True:
            with self._lock:  # _paused changes under the lock: no request enters a paused SGLang
                if not self._paused:
                    out = self.engine.generate(prompt=prompts, input_ids=input_ids, sampling_params=sampling,
                                               return_logprob=return_logprob)
                    return out if isinstance(out, list) else [out]
            left = deadline - time.monotonic()
            if left <= 0:
                return [{"labkit_refused": f"generation stayed paused for {limit:.0f} s (a weight update is in "
                                           "progress or was not restored); call continue_generation() first"}]
            self._resumed.wait(timeout=left)

    # --- weight-update session and transports --------------------------------------------------------------
    @_serial
    def begin_weight_update(self, selector="all") -> dict:
        return _ok(self.engine.begin_weight_update(selector=selector))

    @_serial
    def end_weight_update(self) -> dict:
        return _ok(self.engine.end_weight_update())

    @_serial
    def update_weights_from_tensor(self, payload, load_format=None, flush_cache=True, weight_version=None) -> dict:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

        # Engine.update_weights_from_tensor has no weight_version argument; the request struct does, and
        # SGLang then tags the version atomically with a successful update (never on a refused one).
        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=self.engine._serialize_tensors_per_rank(payload, load_format),
            load_format=load_format, flush_cache=flush_cache, weight_version=weight_version)
        return _ok(self._run(self.engine.tokenizer_manager.update_weights_from_tensor(obj, None)))

    @_serial
    def update_weights_from_distributed(self, names, dtypes, shapes, group_name, flush_cache=True,
                                        load_format=None, weight_version=None) -> dict:
        from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqInput

        obj = UpdateWeightsFromDistributedReqInput(
            names=list(names), dtypes=list(dtypes), shapes=[list(s) for s in shapes], group_name=group_name,
            flush_cache=flush_cache, load_format=load_format, weight_version=weight_version)
        return _ok(self._run(self.engine.tokenizer_manager.update_weights_from_distributed(obj, None)))

    @_serial
    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size, group_name,
                                  backend) -> dict:
        return _ok(self.engine.init_weights_update_group(master_address, master_port, rank_offset, world_size,
                                                         group_name, backend))

    @_serial
    def destroy_weights_update_group(self, group_name) -> dict:
        return _ok(self.engine.destroy_weights_update_group(group_name))

    @_serial
    def set_weight_version(self, version, abort_all_requests=False) -> dict:
        from sglang.srt.managers.io_struct import UpdateWeightVersionReqInput

        tm = self.engine.tokenizer_manager
        obj = UpdateWeightVersionReqInput(new_version=version, abort_all_requests=abort_all_requests)
        if abort_all_requests:  # what the HTTP route does before the same call
            tm.abort_request(abort_all=True)
        self._run(tm.update_weight_version(obj))
        return {"success": True, "message": f"Weight version updated to {version}"}

    @_serial
    def get_weights_by_name(self, name, truncate_size):
        return self.engine.get_weights_by_name(name, truncate_size)

    @_serial
    def model_info(self) -> dict:
        return self.engine.get_model_info()

    def tp_size(self) -> int:
        return self.cfg.tp

    @_serial
    def check_weights(self, action="checksum") -> dict:
        from sglang.srt.managers.io_struct import CheckWeightsReqInput

        ok, msg, ranks, _ = self._run(self.engine.tokenizer_manager.check_weights(CheckWeightsReqInput(action=action)))
        return {"success": bool(ok), "message": str(msg), "ranks": ranks}

    # --- cache and scheduling ------------------------------------------------------------------------------
    @_serial
    def flush_cache(self) -> dict:
        return _ok(self.engine.flush_cache())

    @_serial
    def pause_generation(self, mode="abort") -> dict:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        self._paused = True  # first: no request may start on weights that are about to change
        self._resumed.clear()
        self._run(self.engine.tokenizer_manager.pause_generation(PauseGenerationReqInput(mode=mode)))
        return {"success": True, "message": "Generation paused."}

    @_serial
    def continue_generation(self) -> dict:
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        self._run(self.engine.tokenizer_manager.continue_generation(ContinueGenerationReqInput()))
        self._paused = False
        self._resumed.set()
        return {"success": True, "message": "Generation continued."}

    def is_paused(self) -> bool:
        return self._paused

    @_serial
    def release_memory_occupation(self, tags=None) -> dict:
        return _ok(self.engine.release_memory_occupation(tags))

    @_serial
    def resume_memory_occupation(self, tags=None) -> dict:
        return _ok(self.engine.resume_memory_occupation(tags))

    # --- lifecycle -----------------------------------------------------------------------------------------
    def health(self) -> bool:
        """SGLang's processes are alive (what /health answers without SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION)."""
        import psutil

        if self._closed or self.engine.tokenizer_manager.gracefully_exit:
            return False
        pids = self.engine.get_all_child_pids() or self._children()
        return all(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)

    @_serial
    def shutdown(self) -> list[str]:
        """Stop SGLang's processes and remove what they leave in /dev/shm. Returns the removed files."""
        from labkit.compat import sglang as compat

        if not self._closed and self.engine is not None:
            self._closed = True
            # Engine.shutdown kills every descendant of this process (scheduler, detokenizer, and also the
            # multiprocessing resource tracker and torch_shm_manager that would have unlinked its files).
            self.engine.shutdown()
        return compat.cleanup_shm(own_pid=os.getpid())


class ActorBackend:
    """Driver side: every EngineActor method as a bounded `ray.get`; a dead actor is EngineUnreachable."""

    def __init__(self, actor, timeout_s: float):
        self.actor, self.timeout_s = actor, timeout_s

    def with_timeout(self, timeout_s: float) -> ActorBackend:
        return ActorBackend(self.actor, timeout_s)

    def __getattr__(self, method):
        if method.startswith("_"):  # copy/pickle probes are not actor methods
            raise AttributeError(method)

        def call(*args, **kwargs):
            import ray

            from labkit.engine.errors import EngineError, EngineUnreachable

            fn = getattr(self.actor, method)
            if method == "generate":  # its own threads: waiting generates never take pause/continue's
                fn = fn.options(concurrency_group=GENERATE_GROUP)
            try:
                return ray.get(fn.remote(*args, **kwargs), timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise EngineError(f"engine actor call {method} did not answer within {self.timeout_s:.0f} s") from None
            except ray.exceptions.ActorDiedError as e:
                raise EngineUnreachable(f"engine actor died ({method}): {e}") from None

        return call

    def shutdown(self) -> list[str]:
        import ray

        from labkit.compat import sglang as compat

        removed = []
        try:
            removed = ray.get(self.actor.shutdown.remote(), timeout=self.timeout_s)
        except ray.exceptions.RayError:
            pass  # already dead or stuck: killing the actor takes its SGLang children down (PDEATHSIG)
        ray.kill(self.actor, no_restart=True)
        _wait_dead(self.actor)
        return removed + compat.cleanup_shm()


def _wait_dead(actor, timeout_s: float = 30.0) -> None:
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=1)
        except ray.exceptions.RayError:
            return
        time.sleep(0.2)


def remote_class(num_cpus: float = 1, num_gpus: float = 0):
    import ray

    # Control calls: the default group (serialized by EngineActor._lock); generate: its own group.
    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0, max_concurrency=2,
                      concurrency_groups={GENERATE_GROUP: GENERATE_THREADS})(EngineActor)
