"""One engine interface over two backends: a Ray actor holding `sglang.Engine`, or an SGLang HTTP server.

The handle owns everything both backends (labkit.engine.backend.EngineBackend) share: refusing calls that
would crash a CPU engine, refusing updates that do not fit the model (labkit.engine.contract) before they are
sent, turning SGLang's (success=False, message) into EngineError, the shape of generate's results, holding
requests while generation is paused, and bounded waits. Starting the backends: labkit.engine.lifecycle.
"""

from __future__ import annotations

import collections
import time

from labkit.engine import lifecycle
from labkit.engine.backend import EngineBackend
from labkit.engine.config import PAUSE_MODES, EngineConfig
from labkit.engine.contract import Contract, check_tensors
from labkit.engine.errors import EngineError, EngineUnreachable, Unsupported
from labkit.engine.lifecycle import check_model_dir, cpu
from labkit.engine.loader import LoaderQueries, payload_items
from labkit.engine.shard import rank_checksums

__all__ = ["EngineHandle", "check_model_dir"]

HOLD_POLL_S = 0.05  # a request held while paused asks again this often (Ray actor backend)
FULL = 2**31 - 1  # truncate_size that keeps every row (SGLang slices the row list with it)
_NO_CPU_MEMORY_RELEASE = (
    "release/resume_memory_occupation is unsupported on a CPU engine: SGLang's scheduler calls "
    "torch.get_device_module().synchronize(), which raises 'Found no NVIDIA driver on your system', "
    "kills the scheduler and leaves the call hanging; labkit refuses it without asking SGLang")


class EngineHandle(LoaderQueries):
    """Use `EngineHandle.start(cfg)` (Ray actor, or connect when cfg.url is set), `.connect(url)`, or
    `.launch(cfg)` (start an HTTP server subprocess this handle owns)."""

    def __init__(self, backend: EngineBackend, cfg: EngineConfig, kind: str, server=None, actor=None,
                 strategy=None):
        self._b, self.cfg, self.kind, self._server, self._actor = backend, cfg, kind, server, actor
        self._strategy = strategy  # where a restart() puts the new actor
        self._closed = self._paused = False
        self._loaders: tuple[str, ...] | None = None  # custom weight loaders, asked once per start
        self._routes: bool | None = None  # the model passes labkit payloads to labkit's loader (routes_flat)
        self._checksum: str | None = None  # the weight checker's CPU hash (checksum_algo)
        self.pauses = collections.deque(maxlen=64)  # (paused_at, continued_at or None), this handle's calls

    # --- construction (labkit.engine.lifecycle starts the backends) --------------------------------------
    @classmethod
    def start(cls, cfg: EngineConfig, scheduling_strategy=None) -> EngineHandle:
        if cfg.url is not None:
            return cls.connect(cfg.url, cfg)
        backend, actor = lifecycle.start_actor(cfg, scheduling_strategy)
        return cls(backend, cfg, "ray", actor=actor, strategy=scheduling_strategy)

    def restart(self) -> None:
        """Replace a dead or wedged engine with a fresh one from cfg.model_dir, in place (same handle, same
        URL for a launched server). It serves the model dir's weights, weight_version "default"."""
        if self._actor is None and self._server is None:
            raise EngineUnreachable(f"engine at {self.url} was not started by labkit: it cannot be restarted here")
        if self._server is not None:  # the same URL if its port is free again, else a new one (handle.url follows)
            self._b, self._server = lifecycle.restart_server(self._server, self.cfg)
        else:
            # Kill the actor and SGLang's processes, remove /dev/shm leftovers; 10 s if wedged, not a full call timeout
            self._b.with_timeout(10.0).shutdown()
            self._b, self._actor = lifecycle.start_actor(self.cfg, self._strategy)
        self._closed = self._paused = False
        self._loaders = self._routes = self._checksum = None

    @classmethod
    def connect(cls, url: str, cfg: EngineConfig | None = None) -> EngineHandle:
        cfg = cfg or EngineConfig(model_dir="<remote>", url=url)
        return cls(lifecycle.connect_backend(url, cfg), cfg, "http")

    @classmethod
    def launch(cls, cfg: EngineConfig, port: int | None = None) -> EngineHandle:
        backend, server = lifecycle.launch_server(cfg, port)
        return cls(backend, cfg, "http", server=server)

    @property
    def url(self) -> str | None:
        return getattr(self._b, "url", None)

    @property
    def tp_size(self) -> int:
        return self._b.tp_size()

    @property
    def device(self) -> str:
        """The engine's device type, asked once (it decides the engine's FFN padding)."""
        if getattr(self, "_device", None) is None:
            self._device = self._b.device()
        return self._device

    @property
    def call_timeout_s(self) -> float:
        """The bound on each call through this handle (waits labkit makes on the engine's behalf use it too)."""
        return float(getattr(self._b, "timeout_s", 0.0) or 120.0)

    def portable(self, call_timeout_s: float | None = None) -> EngineHandle:
        """A picklable handle to the same engine for another process (e.g. a trainer actor); it owns
        nothing, so its shutdown() leaves the engine running. call_timeout_s bounds each of its calls."""
        b = self._b if call_timeout_s is None else self._b.with_timeout(call_timeout_s)
        h = EngineHandle(b, self.cfg, self.kind)
        h._paused = self._paused
        return h

    # --- plumbing ----------------------------------------------------------------------------------------
    def _refuse_if_closed(self, call: str) -> None:
        if self._closed:
            raise EngineError(f"{call}: this engine handle was shut down")

    def _check(self, items, call: str) -> None:
        """`items` against the model dir's checkpoint in the engine's dtype (labkit.engine.contract), before `call`."""
        contract = Contract.find(self.cfg.model_dir, self.cfg.dtype)
        check_tensors(None if contract is None else contract.tensors, items, call)

    def _control(self, method: str, *args, **kwargs) -> str:
        self._refuse_if_closed(method)
        res = getattr(self._b, method)(*args, **kwargs)
        if not res.get("success", False):
            raise EngineError(f"{method} failed: {res.get('message', '')}")
        return res.get("message", "")

    # --- generation ---------------------------------------------------------------------------------------
    def generate(self, prompts: list[str] | None = None, input_ids: list[list[int]] | None = None,
                 sampling: dict | list[dict] | None = None, return_logprob: bool = False) -> list[dict]:
        """One dict per prompt: tokens (output ids), text, logprobs (per output token, or None), meta_info
        (SGLang's, incl. weight_version and any spec_* keys; the logprob lists are moved out).
        While generation is paused (a weight update) the request waits for continue_generation, at most the
        call timeout, and is then answered by the new weights: an HTTP server holds it itself; for the Ray actor
        backend this handle holds it (see `_generate_held`)."""
        if (prompts is None) == (input_ids is None):
            raise ValueError("generate: pass exactly one of prompts= or input_ids=")
        self._refuse_if_closed("generate")
        sampling = list(sampling) if isinstance(sampling, (list, tuple)) else dict(sampling or {})  # or one per prompt
        outs = self._generate_held(prompts, input_ids, sampling, bool(return_logprob))
        results = []
        for o in outs:
            meta = dict(o.get("meta_info", {}))
            lps = meta.pop("output_token_logprobs", None)
            meta.pop("input_token_logprobs", None)
            results.append({"tokens": list(o.get("output_ids", [])), "text": o.get("text", ""),
                            "logprobs": [float(x[0]) for x in lps] if return_logprob and lps is not None else None,
                            "meta_info": meta})
        return results

    # --- weight updates -------------------------------------------------------------------------------------
    def begin_weight_update(self, selector: str = "all") -> str:
        return self._control("begin_weight_update", selector)

    def end_weight_update(self) -> str:
        return self._control("end_weight_update")

    def update_weights_from_tensor(self, payload, load_format: str | None = None, flush_cache: bool = True,
                                   weight_version: str | None = None) -> str:
        """`payload`: [(hf_name, tensor), ...], or for load_format="flattened_bucket" one serialized payload
        per TP rank. Must run inside begin/end_weight_update. weight_version is set only if SGLang accepts.
        Named tensors are checked against the model's names, shapes and dtypes first (labkit.engine.contract):
        SGLang would cast another dtype with a plain copy, into fp8 with the old scale (garbage, "Success")."""
        payload = list(payload)
        if load_format is None:
            items = [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in payload]
            self._check(items, "update_weights_from_tensor")
        return self._control("update_weights_from_tensor", payload, load_format, flush_cache, weight_version)

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str = "weight_update_group", flush_cache: bool = True,
                                        load_format: str | None = None, weight_version: str | None = None) -> str:
        self._check(payload_items(names, shapes), "update_weights_from_distributed")
        return self._control("update_weights_from_distributed", names, dtypes, shapes, group_name, flush_cache,
                             load_format, weight_version)

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str | None = None) -> str:
        backend = backend or ("gloo" if cpu() else "nccl")
        return self._control("init_weights_update_group", master_address, master_port, rank_offset, world_size,
                             group_name, backend)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> str:
        return self._control("destroy_weights_update_group", group_name)

    @property
    def weight_version(self) -> str:
        """The version SGLang tags outputs with now ("default" until an update sets one)."""
        return self.model_info()["weight_version"]

    def set_weight_version(self, version: str, abort_all_requests: bool = False) -> str:
        return self._control("set_weight_version", version, abort_all_requests)

    def model_info(self) -> dict:
        self._refuse_if_closed("model_info")
        return self._b.model_info()

    def get_weights_by_name(self, name: str, truncate_size: int | None = None):
        """The engine's tensor for an HF name, as float32 (SGLang converts with .to(float32); exact for
        fp32/bf16/fp16 weights). truncate_size=None reads every row; an int keeps that many rows."""
        import torch

        self._refuse_if_closed("get_weights_by_name")
        rows = self._b.get_weights_by_name(name, FULL if truncate_size is None else truncate_size)
        if rows is None:
            raise EngineError(f"get_weights_by_name({name!r}) failed: SGLang returned no tensor (unknown name, "
                              "or the model class cannot export it; see the engine log)")
        return torch.tensor(rows, dtype=torch.float32)

    def checksums(self) -> dict[str, str]:
        """SGLang's weight checker: {engine parameter name: checksum}, in the engine's layout (fused qkv_proj /
        gate_up_proj). CPU tensors: `xxh3:` + 16 hex chars with labkit's models, else sha256's first 8 bytes as
        16 hex chars (`checksum_algo`, labkit.engine.checksum). At TP > 1 every rank's, keyed
        `labkit.engine.shard.rank_key` (name#tp<rank>)."""
        self._refuse_if_closed("checksums")
        res = self._b.check_weights("checksum")
        if not res["success"]:
            raise EngineError(f"checksums failed: {res['message']}")
        return rank_checksums(res["ranks"] or [])

    # --- cache and scheduling ------------------------------------------------------------------------------
    def flush_cache(self) -> str:
        return self._control("flush_cache")

    def _generate_held(self, prompts, input_ids, sampling, return_logprob: bool) -> list:
        """The actor runs one call at a time, so a request parked inside SGLang until continue_generation would
        block the very call that continues it: the actor refuses while paused (EngineActor.generate), and the
        request waits here instead, polling, until the sync ends or the call timeout passes (then the refusal
        is raised, naming it). A request is never answered by weights in the middle of a sync."""
        deadline = time.monotonic() + getattr(self._b, "timeout_s", 0.0)
        while True:
            refusal = "generation is paused; call continue_generation() first" if (
                self._paused and self._actor is not None) else None
            if refusal is None:
                outs = self._b.generate(prompts, input_ids, sampling, return_logprob)
                if not (outs and "labkit_refused" in outs[0]):
                    return outs
                refusal = outs[0]["labkit_refused"]
            if time.monotonic() >= deadline:
                raise EngineError(f"generate: {refusal} (held {getattr(self._b, 'timeout_s', 0.0):.0f} s)")
            time.sleep(HOLD_POLL_S)

    def pause_generation(self, mode: str = "abort") -> str:
        """SGLang's pause: new requests are held until continue_generation; in-flight ones are aborted
        ("abort"), moved back to the waiting queue and recomputed after continue ("retract"), or left in
        place with their KV ("in_place"). `pauses` keeps (paused_at, continued_at) per pause (time.monotonic)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause_generation: mode={mode!r} is invalid: expected one of {', '.join(PAUSE_MODES)}")
        t0 = time.monotonic()
        msg = self._control("pause_generation", mode)
        self._paused = True
        self.pauses.append((t0, None))
        return msg

    def continue_generation(self) -> str:
        msg = self._control("continue_generation")
        self._paused = False
        if self.pauses and self.pauses[-1][1] is None:
            self.pauses[-1] = (self.pauses[-1][0], time.monotonic())
        return msg

    def release_memory(self, tags: list[str] | None = None) -> str:
        """GPU only (untested in labkit): SGLang's release_memory_occupation("weights"/"kv_cache")."""
        if cpu():
            raise Unsupported(_NO_CPU_MEMORY_RELEASE)
        return self._control("release_memory_occupation", tags)

    def resume_memory(self, tags: list[str] | None = None) -> str:
        if cpu():
            raise Unsupported(_NO_CPU_MEMORY_RELEASE)
        return self._control("resume_memory_occupation", tags)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def health(self) -> bool:
        return not self._closed and self._b.health()

    def on_shutdown(self, fn) -> None:
        """Call `fn()` first thing in `shutdown`: what another layer tied to this engine (labkit.sync.atomic's
        host copy of the last good weights, a model's worth of tmpfs) goes with it; the handle does not look in."""
        self.__dict__.setdefault("_shutdown_hooks", []).append(fn)

    def shutdown(self) -> list[str]:
        """Stop what this handle started (actor and its SGLang processes, or the owned server) and remove
        their /dev/shm leftovers; a connect()ed server is left running. Idempotent. Returns removed files."""
        if self._closed:
            return []
        self._closed = True
        for hook in self.__dict__.pop("_shutdown_hooks", ()):  # see on_shutdown
            hook()
        if self._server is not None:
            return self._server.stop()
        if self._actor is not None:
            return self._b.shutdown()
        return []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

