"""What to start (or where to connect): one frozen, validated record shared by both engine backends."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("auto", "float32", "bfloat16")
# SGLang sizes a CPU engine's KV cache from free RAM when neither sizing field is given: measured 30.2M
# tokens / 14.4 GB for the 64-hidden tiny model on this 23 GB box. On CPU we cap it unless told otherwise.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
PAUSE_MODES = ("abort", "retract", "in_place")  # SGLang's PauseGenerationReqInput.mode


def _bad(field: str, value, allowed: str) -> ValueError:
    return ValueError(f"EngineConfig.{field}={value!r} is invalid: expected {allowed}")


SPEC_ALGORITHMS = ("NEXTN", "EAGLE")  # NEXTN: SGLang's spelling for a model's own MTP layer as the draft (EAGLE worker)


@dataclass(kw_only=True, slots=True, frozen=True)
class SpeculativeConfig:
    """SGLang speculative decoding with the model's MTP layer as the draft. GPU only: SGLang's EAGLE worker has
    no CPU path (on CPU, `labkit.mtp.speculative` measures the same counters over the same weights).

    Defaults are MiMo's own recipe (1 step, top-1, 2 draft tokens = 1 draft + the bonus token); verl's MTP
    rollouts use steps 2, top-k 2, draft tokens 4. Sync the draft with the trainer: `SyncConfig(selector="all")`
    (the default) updates target and draft in the same weight-update session.
    """

    algorithm: str = "NEXTN"
    num_steps: int = 1
    eagle_topk: int = 1
    num_draft_tokens: int = 2
    draft_model_path: str | None = None  # None: the target's directory (MiMo/DeepSeek ship the MTP layer there)

    def __post_init__(self):
        if self.algorithm not in SPEC_ALGORITHMS:
            raise _bad("speculative.algorithm", self.algorithm, f"one of {', '.join(SPEC_ALGORITHMS)}")
        for f in ("num_steps", "eagle_topk", "num_draft_tokens"):
            if not (_is_int(getattr(self, f)) and getattr(self, f) >= 1):
                raise _bad(f"speculative.{f}", getattr(self, f), "a positive int")
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise _bad("speculative.num_draft_tokens", self.num_draft_tokens,
                       f"num_steps + 1 = {self.num_steps + 1} for a top-1 chain")

    def sglang_kwargs(self, model_dir: str) -> dict:
        return {"speculative_algorithm": self.algorithm, "speculative_num_steps": self.num_steps,
                "speculative_eagle_topk": self.eagle_topk, "speculative_num_draft_tokens": self.num_draft_tokens,
                "speculative_draft_model_path": self.draft_model_path or model_dir}


@dataclass(kw_only=True, slots=True, frozen=True)
class EngineConfig:
    """An SGLang engine.

    url=None starts an in-process `sglang.Engine` inside a Ray actor; a URL talks to a running
    `sglang.launch_server`. The sizing fields are SGLang's server arguments; None leaves SGLang's default,
    except that a CPU engine with neither set gets max_total_tokens=CPU_DEFAULT_MAX_TOTAL_TOKENS.
    """

    model_dir: str
    dtype: str = "auto"  # "auto": config.json's torch_dtype; float32 runs on CPU (needed for bitwise checks)
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    tp: int = 1  # CPU engines run TP=1 (checked at start, where the device is known)
    random_seed: int = 0
    url: str | None = None
    # labkit/MiMo model dirs resolve `model_type: mimo` through configuration_mimo.py shipped beside
    # config.json (auto_map), which transformers loads only with trust_remote_code.
    trust_remote_code: bool = True
    log_level: str = "error"
    start_timeout_s: float = 300.0  # engine/server start-up, incl. SGLang's imports (~20-40 s on 2 CPU cores)
    call_timeout_s: float = 120.0  # every other call; nothing waits forever
    speculative: SpeculativeConfig | None = None  # the MTP draft in SGLang (GPU only)

    def __post_init__(self):
        if not isinstance(self.model_dir, str) or not self.model_dir:
            raise _bad("model_dir", self.model_dir, "a non-empty path string (an HF model directory)")
        if self.dtype not in DTYPES:
            raise _bad("dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        if self.mem_fraction_static is not None and not (isinstance(self.mem_fraction_static, (int, float))
                                                         and 0.0 < self.mem_fraction_static <= 1.0):
            raise _bad("mem_fraction_static", self.mem_fraction_static, "None or a float in (0, 1]")
        if self.max_total_tokens is not None and not (_is_int(self.max_total_tokens) and self.max_total_tokens > 0):
            raise _bad("max_total_tokens", self.max_total_tokens, "None or a positive int")
        if not (_is_int(self.tp) and self.tp >= 1):
            raise _bad("tp", self.tp, "a positive int (1 on CPU)")
        if not _is_int(self.random_seed):
            raise _bad("random_seed", self.random_seed, "an int")
        if self.url is not None and not (isinstance(self.url, str) and self.url.startswith(("http://", "https://"))):
            raise _bad("url", self.url, "None (in-process engine in a Ray actor) or an http(s):// URL")
        if not isinstance(self.trust_remote_code, bool):
            raise _bad("trust_remote_code", self.trust_remote_code, "a bool")
        if self.log_level not in LOG_LEVELS:
            raise _bad("log_level", self.log_level, f"one of {', '.join(LOG_LEVELS)}")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise _bad("speculative", self.speculative, "None or a SpeculativeConfig")
        for f in ("start_timeout_s", "call_timeout_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise _bad(f, v, "a positive number of seconds")

    def sglang_kwargs(self, device: str) -> dict:
        """Keyword arguments for `sglang.Engine` (names of SGLang's ServerArgs)."""
        kw = {"model_path": self.model_dir, "dtype": self.dtype, "tp_size": self.tp, "random_seed": self.random_seed,
              "trust_remote_code": self.trust_remote_code, "log_level": self.log_level, "device": device}
        if self.mem_fraction_static is not None:
            kw["mem_fraction_static"] = float(self.mem_fraction_static)
        if self.max_total_tokens is not None:
            kw["max_total_tokens"] = self.max_total_tokens
        elif device == "cpu" and self.mem_fraction_static is None:
            kw["max_total_tokens"] = CPU_DEFAULT_MAX_TOTAL_TOKENS
        if self.speculative is not None:
            if device == "cpu":
                raise ValueError("EngineConfig.speculative is GPU only: SGLang's EAGLE/NEXTN worker has no CPU path "
                                 "(labkit.mtp.speculative measures acceptance on CPU)")
            kw.update(self.speculative.sglang_kwargs(self.model_dir))
        if device == "cpu":
            # An idle scheduler otherwise spins one core at 100% (measured), half of this 2-core box; with
            # this it blocks in zmq poll (1 s timeout) and wakes at once on a request.
            kw["sleep_on_idle"] = True
        return kw

    def server_argv(self, device: str, host: str, port: int) -> list[str]:
        """The same settings as `python -m sglang.launch_server` flags."""
        argv = []
        for k, v in self.sglang_kwargs(device).items():
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                argv += [flag] if v else []
            else:
                argv += [flag, str(v)]
        return argv + ["--host", host, "--port", str(port)]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
