"""What to start (or where to connect): one frozen, validated record shared by both engine backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from labkit.config import check, check_choice

Dtype = Literal["auto", "float32", "bfloat16"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
PauseMode = Literal["abort", "retract", "in_place"]  # SGLang's PauseGenerationReqInput.mode
SpecAlgorithm = Literal["NEXTN", "EAGLE"]  # NEXTN: SGLang's spelling for a model's own MTP layer as the draft
DTYPES, LOG_LEVELS, PAUSE_MODES, SPEC_ALGORITHMS = (get_args(t) for t in (Dtype, LogLevel, PauseMode, SpecAlgorithm))
# SGLang sizes a CPU engine's KV cache from free RAM when neither sizing field is given (about 30M tokens,
# 14 GB, for the tiny model on a 23 GB box). On CPU we cap it unless told otherwise.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384
# labkit's engine-side apply, listed in SGLang's `custom_weight_loader` at launch.
APPLY_FORMAT = "labkit.engine.inside.apply.load_flat"


def _pos_int(label: str, v, allowed: str = "a positive int") -> None:
    check(_is_int(v) and v >= 1, label, v, allowed)


@dataclass(kw_only=True, slots=True, frozen=True)
class SpeculativeConfig:
    """SGLang speculative decoding with the model's MTP layer as the draft. On a CPU engine SGLang's own worker runs
    through labkit.compat.spec_cpu (top-k 1 chains; verification at T > 0 target-only, as on GPU).

    Defaults are MiMo's own recipe (1 step, top-1, 2 draft tokens = 1 draft + the bonus token); verl's MTP
    rollouts use steps 2, top-k 2, draft tokens 4. Sync the draft with the trainer: `SyncConfig(selector="all")`
    (the default) updates target and draft in the same weight-update session.
    Field names are SGLang's `speculative_*` server arguments: `num_draft_tokens` counts the verified token
    too (k + 1 for a top-1 chain of k drafts), unlike the k (`draft_len`) of `labkit.mtp.acceptance`.
    """

    algorithm: SpecAlgorithm = "NEXTN"
    """SGLang's speculative_algorithm (NEXTN: the model's own MTP layer as the draft)."""
    num_steps: int = 1
    """SGLang's speculative_num_steps: draft steps per verify (k for a top-1 chain)."""
    eagle_topk: int = 1
    """SGLang's speculative_eagle_topk: branches per draft step."""
    num_draft_tokens: int = 2
    """SGLang's speculative_num_draft_tokens: k + 1 for a top-1 chain (the drafts plus the verified token)."""
    draft_model_path: str | None = None
    """None: the target's directory (MiMo/DeepSeek ship the MTP layer there)."""

    def __post_init__(self):
        check_choice(self, "algorithm", "EngineConfig.speculative.algorithm")
        for f in ("num_steps", "eagle_topk", "num_draft_tokens"):
            _pos_int(f"EngineConfig.speculative.{f}", getattr(self, f))
        check(self.eagle_topk != 1 or self.num_draft_tokens == self.num_steps + 1,
              "EngineConfig.speculative.num_draft_tokens", self.num_draft_tokens,
              f"num_steps + 1 = {self.num_steps + 1} for a top-1 chain")

    def check_cpu(self) -> None:
        """A CPU engine runs SGLang's worker through labkit.compat.spec_cpu: top-k 1 chains only."""
        check(self.eagle_topk == 1, "EngineConfig.speculative.eagle_topk", self.eagle_topk,
              "1 on a CPU engine (labkit.compat.spec_cpu runs top-k 1 chains; a tree needs GPU attention kernels)")

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
    """HF model directory the engine loads."""
    dtype: Dtype = "auto"
    """auto: config.json's torch_dtype; float32 runs on CPU (needed for bitwise checks)."""
    mem_fraction_static: float | None = None
    """SGLang's mem_fraction_static (None: SGLang's default)."""
    max_total_tokens: int | None = None
    """SGLang's KV-cache size in tokens (None: SGLang's default; CPU_DEFAULT_MAX_TOTAL_TOKENS on CPU)."""
    tp: int = 1
    """SGLang tensor parallelism (on CPU at most one rank per core: labkit.compat.cpu_tp, checked at start where the
    device is known)."""
    random_seed: int = 0
    """SGLang's sampling seed."""
    url: str | None = None
    """None: an in-process engine in a Ray actor; an http(s):// URL: a running SGLang server."""
    trust_remote_code: bool = True
    """labkit/MiMo model dirs resolve `model_type: mimo` through configuration_mimo.py beside config.json
    (auto_map), which transformers loads only with trust_remote_code."""
    log_level: LogLevel = "error"
    """SGLang's log level."""
    start_timeout_s: float = 300.0
    """Engine/server start-up, incl. SGLang's imports (~20-40 s on 2 CPU cores)."""
    call_timeout_s: float = 120.0
    """Every other engine call: nothing waits forever."""
    speculative: SpeculativeConfig | None = None
    """SGLang's speculative decoding with the MTP layer as the draft (on CPU through labkit.compat.spec_cpu)."""

    def __post_init__(self):
        check(isinstance(self.model_dir, str) and bool(self.model_dir), "EngineConfig.model_dir", self.model_dir,
              "a non-empty path string (an HF model directory)")
        check_choice(self, "dtype", "EngineConfig.dtype")
        check(self.mem_fraction_static is None or (isinstance(self.mem_fraction_static, (int, float))
                                                   and 0.0 < self.mem_fraction_static <= 1.0),
              "EngineConfig.mem_fraction_static", self.mem_fraction_static, "None or a float in (0, 1]")
        if self.max_total_tokens is not None:
            _pos_int("EngineConfig.max_total_tokens", self.max_total_tokens, "None or a positive int")
        _pos_int("EngineConfig.tp", self.tp, "a positive int")
        check(_is_int(self.random_seed), "EngineConfig.random_seed", self.random_seed, "an int")
        check(self.url is None or (isinstance(self.url, str) and self.url.startswith(("http://", "https://"))),
              "EngineConfig.url", self.url, "None (in-process engine in a Ray actor) or an http(s):// URL")
        check(isinstance(self.trust_remote_code, bool), "EngineConfig.trust_remote_code", self.trust_remote_code,
              "a bool")
        check_choice(self, "log_level", "EngineConfig.log_level")
        check(self.speculative is None or isinstance(self.speculative, SpeculativeConfig), "EngineConfig.speculative",
              self.speculative, "None or a SpeculativeConfig")
        for f in ("start_timeout_s", "call_timeout_s"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f"EngineConfig.{f}", v,
                  "a positive number of seconds")

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
                self.speculative.check_cpu()
                check(self.tp == 1, "EngineConfig.tp", self.tp, "1 with speculative on a CPU engine (labkit.compat."
                      "spec_cpu has run SGLang's speculative worker at TP 1 only)")
            kw.update(self.speculative.sglang_kwargs(self.model_dir))
        # labkit's engine-side apply of a flat bucket (mapped once, a copy plan): a format SGLang then accepts.
        kw["custom_weight_loader"] = [APPLY_FORMAT]
        if device == "cpu":
            # An idle scheduler otherwise spins one core at 100% (measured; half of a 2-core CPU); with
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
            elif isinstance(v, list):
                argv += [flag, *map(str, v)]
            else:
                argv += [flag, str(v)]
        return argv + ["--host", host, "--port", str(port)]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
