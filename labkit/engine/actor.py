"""The in-process backend: a real `sglang.Engine` hosted by a Ray actor.

The actor process is where SGLang gets imported, so the CPU compat layer and the model-package hook are
applied in `__init__` before the first `import sglang` (SGLang's scheduler/detokenizer subprocesses inherit
both through the environment). Methods answer plain data: control calls a `{"success", "message"}` dict,
like the HTTP server's JSON, so the handle treats both backends alike.
"""

from __future__ import annotations

import os
import time

import psutil

from labkit.cluster import allocator, runtime
from labkit.compat import cpu_tp, quiet
from labkit.compat import sglang as compat
from labkit.engine import last_words
from labkit.engine.errors import EngineUnreachable

# Ray, SGLang and torch are imported where they are crossed: labkit.engine.http imports this module for
# MODEL_PACKAGE, and importing labkit.engine stays cheap.
MODEL_PACKAGE = "labkit.engine.inside.sglang_models"


def _ok(res) -> dict:
    """SGLang answers (success, message) tuples or *ReqOutput structs; normalize to a dict."""
    if isinstance(res, tuple):
        return {"success": bool(res[0]), "message": str(res[1]) if len(res) > 1 else ""}
    if hasattr(res, "success"):
        return {"success": bool(res.success), "message": str(getattr(res, "message", "") or "")}
    return {"success": True, "message": "" if res is None else str(res)}


class EngineActor:
    """Wrapped with `ray.remote` by `remote_class()` so that importing this module does not import Ray. A failed
    start does not raise from __init__ (Ray would bury SGLang's message in its own): `ready()` answers {"error": ...}
    and the handle kills the actor."""

    def __init__(self, cfg):
        self.cfg, self.engine, self.error, self._closed, self._paused = cfg, None, None, False, False
        quiet.install()  # before SGLang is imported here or in its scheduler/detokenizer subprocesses
        allocator.install()  # this actor and its subprocesses hand freed memory back (an attached cluster's too)
        self.layers = compat.apply()
        # SGLang's registry serves our MiMo (adds get_weights_by_name) and loads its own zoo on demand.
        os.environ.setdefault("SGLANG_EXTERNAL_MODEL_PACKAGE", MODEL_PACKAGE)
        if self.layers:  # CPU: TP > 1 ranks bind their threads to cores of their own (labkit.compat.cpu_tp)
            os.environ.update(cpu_tp.launch_env(cfg.tp))
        self._tee = last_words.StderrTee()
        try:
            import ray
            import sglang
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.engine = sglang.Engine(**cfg.sglang_kwargs(device), custom_sigquit_handler=last_words.launch_sigquit)
            # What startup built (model, allocators, modules) lives as long as the engine: freeze_gc moves it out of
            # reach of the gc.collect() SGLang's CPU empty_cache runs in every flush_cache, i.e. every weight update.
            self.engine.freeze_gc()
            last_words.record_on_sigquit(self.engine, self._tee, ray.get_runtime_context().get_actor_id())
        except BaseException as e:  # incl. LaunchFailed raised from the signal handler
            time.sleep(0.5)  # let the pump take the child's last lines
            self.error = f"{type(e).__name__}: {e}\n--- SGLang's error ---\n{self._tee.root_cause()}"
            self._kill_children()

    def ready(self) -> dict:
        if self.error is not None:
            return {"error": self.error, "pid": os.getpid()}
        return {"pid": os.getpid(), "compat": self.layers, "children": self._children()}

    def _kill_children(self) -> None:
        procs = psutil.Process().children(recursive=True)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)

    def _children(self) -> list[int]:
        return [p.pid for p in psutil.Process().children(recursive=True)]

    def _run(self, coro):
        """What Engine's own methods do, for requests it has no method for or drops a field of (weight_version)."""
        return self.engine.loop.run_until_complete(coro)

    # --- generation -------------------------------------------------------------------------------------
    def generate(self, prompts, input_ids, sampling, return_logprob) -> list[dict]:
        if self._paused:
            # This actor runs one call at a time: a request parked inside SGLang until continue_generation
            # would block the very call that continues it. Refuse instead (the handle raises EngineError).
            return [{"labkit_refused": "generation is paused (a weight update is in progress or was not "
                                       "restored); call continue_generation() first"}]
        out = self.engine.generate(prompt=prompts, input_ids=input_ids, sampling_params=sampling,
                                   return_logprob=return_logprob)
        return out if isinstance(out, list) else [out]

    # --- weight-update session and transports --------------------------------------------------------------
    def begin_weight_update(self, selector="all") -> dict:
        return _ok(self.engine.begin_weight_update(selector=selector))

    def end_weight_update(self) -> dict:
        return _ok(self.engine.end_weight_update())

    def update_weights_from_tensor(self, payload, load_format=None, flush_cache=True, weight_version=None) -> dict:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

        from labkit.engine.ipc import from_ray

        # Engine.update_weights_from_tensor has no weight_version argument; the request struct does (SGLang tags
        # the version atomically with a successful update). Payloads the sender serialized pass as they are.
        pre = load_format == "flattened_bucket" or (payload and isinstance(payload[0], (str, bytes)))
        payload = from_ray(payload)  # fp8 tensors crossed Ray as bytes (labkit.engine.ipc.to_ray)
        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=self.engine._serialize_tensors_per_rank(
                payload, "flattened_bucket" if pre else load_format),
            load_format=load_format, flush_cache=flush_cache, weight_version=weight_version)
        return _ok(self._run(self.engine.tokenizer_manager.update_weights_from_tensor(obj, None)))

    def update_weights_from_distributed(self, names, dtypes, shapes, group_name, flush_cache=True,
                                        load_format=None, weight_version=None) -> dict:
        from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqInput

        obj = UpdateWeightsFromDistributedReqInput(
            names=list(names), dtypes=list(dtypes), shapes=[list(s) for s in shapes], group_name=group_name,
            flush_cache=flush_cache, load_format=load_format, weight_version=weight_version)
        return _ok(self._run(self.engine.tokenizer_manager.update_weights_from_distributed(obj, None)))

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size, group_name,
                                  backend) -> dict:
        return _ok(self.engine.init_weights_update_group(master_address, master_port, rank_offset, world_size,
                                                         group_name, backend))

    def destroy_weights_update_group(self, group_name) -> dict:
        return _ok(self.engine.destroy_weights_update_group(group_name))

    def set_weight_version(self, version, abort_all_requests=False) -> dict:
        from sglang.srt.managers.io_struct import UpdateWeightVersionReqInput

        tm = self.engine.tokenizer_manager
        obj = UpdateWeightVersionReqInput(new_version=version, abort_all_requests=abort_all_requests)
        if abort_all_requests:  # what the HTTP route does before the same call
            tm.abort_request(abort_all=True)
        self._run(tm.update_weight_version(obj))
        return {"success": True, "message": f"Weight version updated to {version}"}

    def get_weights_by_name(self, name, truncate_size):
        return self.engine.get_weights_by_name(name, truncate_size)

    def model_info(self) -> dict:
        return self.engine.get_model_info()

    def tp_size(self) -> int:
        return self.cfg.tp

    def device(self) -> str:
        return str(self.engine.server_args.device)

    def node(self) -> dict:
        return runtime.here()

    def custom_weight_loaders(self) -> list[str]:
        return list(self.engine.server_args.custom_weight_loader or [])

    def check_weights(self, action="checksum") -> dict:
        from sglang.srt.managers.io_struct import CheckWeightsReqInput

        ok, msg, ranks, _ = self._run(self.engine.tokenizer_manager.check_weights(CheckWeightsReqInput(action=action)))
        return {"success": bool(ok), "message": str(msg), "ranks": ranks}

    # --- cache and scheduling ------------------------------------------------------------------------------
    def flush_cache(self) -> dict:
        return _ok(self.engine.flush_cache())

    def pause_generation(self, mode="abort") -> dict:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        self._paused = True  # first: no request may start on weights that are about to change
        self._run(self.engine.tokenizer_manager.pause_generation(PauseGenerationReqInput(mode=mode)))
        return {"success": True, "message": "Generation paused."}

    def continue_generation(self) -> dict:
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        self._run(self.engine.tokenizer_manager.continue_generation(ContinueGenerationReqInput()))
        self._paused = False
        return {"success": True, "message": "Generation continued."}

    def release_memory_occupation(self, tags=None) -> dict:
        return _ok(self.engine.release_memory_occupation(tags))

    def resume_memory_occupation(self, tags=None) -> dict:
        return _ok(self.engine.resume_memory_occupation(tags))

    # --- lifecycle -----------------------------------------------------------------------------------------
    def health(self) -> bool:
        """SGLang's processes are alive (what /health answers without SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION)."""
        if self._closed or self.engine.tokenizer_manager.gracefully_exit:
            return False
        pids = self.engine.get_all_child_pids() or self._children()
        return all(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)

    def shutdown(self) -> list[str]:
        """Stop SGLang's processes and remove what they leave in /dev/shm. Returns the removed files."""
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

    def update_weights_from_tensor(self, payload, *args, **kwargs) -> dict:
        from labkit.engine.ipc import to_ray  # torch: where a tensor crosses, not with this module

        return self.__getattr__("update_weights_from_tensor")(to_ray(list(payload)), *args, **kwargs)

    def __getattr__(self, method):
        if method.startswith("_"):  # copy/pickle probes are not actor methods
            raise AttributeError(method)

        def call(*args, **kwargs):
            import ray

            try:
                # task events off per call: a handle passed to the trainer did not carry the actor's own setting
                # (labkit.cluster.runtime.LOCAL_DAEMONS says what that cost the GCS)
                call = getattr(self.actor, method).options(enable_task_events=False)
                return ray.get(call.remote(*args, **kwargs), timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError:
                # As over HTTP: an engine that does not answer in time is wedged (unreachable), not refusing;
                # the atomic guard then restarts it instead of waiting on it again.
                raise EngineUnreachable(f"engine actor call {method} did not answer within "
                                        f"{self.timeout_s:.0f} s") from None
            except ray.exceptions.ActorDiedError as e:
                said = last_words.summary(last_words.heard(self.actor))
                raise EngineUnreachable(f"engine actor died ({method})"
                                        + (f"; SGLang said: {said}" if said else "") + f" [Ray: {e}]") from None

        return call

    def shutdown(self) -> list[str]:
        import ray

        try:
            removed = ray.get(self.actor.shutdown.remote(), timeout=self.timeout_s)
        except ray.exceptions.RayError:  # dead or stuck: killing the actor takes its SGLang children down (PDEATHSIG)
            removed = []
        ray.kill(self.actor, no_restart=True)
        runtime.wait_dead([self.actor])
        last_words.forget(self.actor)
        return removed + compat.cleanup_shm()


def remote_class(num_cpus: float = 1, num_gpus: float = 0):
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)(EngineActor)
