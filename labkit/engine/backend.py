"""The interface EngineHandle drives: what labkit.engine.actor's ActorBackend (an SGLang Engine in a Ray actor)
and labkit.engine.http's HttpBackend (an SGLang HTTP server) both provide.

Written down so a third backend (or a change to one of the two) shows what the handle relies on, instead of
finding out from an AttributeError in the middle of a sync. Control calls answer SGLang's own
{"success": bool, "message": str}; the handle turns a refusal into EngineError. Every call is bounded by
`timeout_s` and raises EngineUnreachable when the engine does not answer in time.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class EngineBackend(Protocol):
    timeout_s: float

    def with_timeout(self, timeout_s: float) -> EngineBackend:
        """The same engine, each call bounded by `timeout_s` (a portable handle's own bound)."""

    def health(self) -> bool: ...

    def model_info(self) -> dict: ...

    def tp_size(self) -> int: ...

    def device(self) -> str:
        """The engine's device type (\"cpu\", \"cuda\"): a CPU engine pads FFN widths (contract.ffn_padding)."""
        ...

    def node(self) -> dict:
        """{"node_id": Ray node id or None, "node_ip"}: where the engine runs."""
        ...

    def custom_weight_loaders(self) -> list[str]:
        """SGLang's `custom_weight_loader` server argument: the load formats beyond SGLang's own it accepts."""

    def generate(self, prompts: list[str] | None, input_ids: list[list[int]] | None, sampling: dict | list[dict],
                 return_logprob: bool) -> list[dict]:
        """SGLang's outputs; a first output holding "labkit_refused" says the engine refused while paused."""

    def begin_weight_update(self, selector: str = "all") -> dict: ...

    def end_weight_update(self) -> dict: ...

    def update_weights_from_tensor(self, payload: Any, load_format: str | None = None, flush_cache: bool = True,
                                   weight_version: str | None = None) -> dict: ...

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, flush_cache: bool = True, load_format: str | None = None,
                                        weight_version: str | None = None) -> dict: ...

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str) -> dict: ...

    def destroy_weights_update_group(self, group_name: str) -> dict: ...

    def set_weight_version(self, version: str, abort_all_requests: bool = False) -> dict: ...

    def get_weights_by_name(self, name: str, truncate_size: int) -> list | None: ...

    def check_weights(self, action: str = "checksum") -> dict: ...

    def flush_cache(self) -> dict: ...

    def pause_generation(self, mode: str = "abort") -> dict: ...

    def continue_generation(self) -> dict: ...

    def release_memory_occupation(self, tags: list[str] | None = None) -> dict: ...

    def resume_memory_occupation(self, tags: list[str] | None = None) -> dict: ...
