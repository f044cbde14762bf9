"""The engine's checksum replies, remembered until a request that may write weights reaches its scheduler.

Why: a guarded sync hashed the whole model on the engine twice, once after the sync (verification) and once
before the next one (the atomic guard's check that nobody changed the weights in between, labkit.sync.atomic).
Between the two an RL loop's engine only generates, so the second hash re-reads bytes the first one read (the
`guard` phase of `bench/phases_end_to_end` in `labkit bench sync` shows what is left of it).

How it stays exact: the scheduler's dispatcher tells the memo about every request before running it
(`labkit.engine.inside.sglang_models.weights.install_checksum` wraps the handlers). Only requests on a short list that
cannot write a parameter keep the memo (generation, cache flushes, versions, pause/continue, reads of weights
and checksums); any other request, one this list has never heard of included, forgets it first. An allowlist,
not a denylist: a weight-writing request added by a later SGLang forgets the memo instead of slipping past it.
Writes that reach the weights with no request turn the memo off: labkit's `direct` transport shares the
parameters with the trainer, which then writes into them itself until it closes the sync (`hold` at the share,
`release` at the close), and SGLang's expert rebalancer (EPLB) moves expert weights from inside the scheduler
loop (`disable`, for good).

What it does not catch, and the per-sync hash did not either: a bug that writes into a parameter while
serving. Pure: no SGLang import (the request classes are told apart by name), unit-tested on its own.
"""

from __future__ import annotations

import copy

# Scheduler requests that cannot write a parameter (SGLang 0.5.23's io_struct names)
READ_ONLY = frozenset({
    "TokenizedGenerateReqInput", "TokenizedEmbeddingReqInput", "BatchTokenizedGenerateReqInput",
    "BatchTokenizedEmbeddingReqInput", "FlushCacheReqInput", "AbortReq", "OpenSessionReqInput",
    "CloseSessionReqInput", "UpdateWeightVersionReqInput", "GetWeightsByNameReqInput", "CheckWeightsReqInput",
    "PauseGenerationReqInput", "ContinueGenerationReqInput", "GetInternalStateReq", "FreezeGCReq",
    "ConfigureLoggingReq", "ProfileReq", "GetHiCacheL3LayoutReq", "ListExternalCorporaReqInput",
})
NOT_INSTALLED = "no scheduler dispatcher reports its requests to the memo"
# Weight-checker actions that write ("reset_tensors" fills the parameters with a pattern); the others read
WRITING_CHECK_ACTIONS = frozenset({"reset_tensors"})


class Memo:
    """Checksum replies keyed by (role, skipped names), valid while no request since could have written."""

    def __init__(self):
        self._replies: dict[tuple, dict] = {}
        self.disabled: str | None = NOT_INSTALLED  # why the memo is off, if it is
        self.held: str | None = None  # why it is off until `release`, if it is
        self.hits = 0

    def enable(self) -> None:
        """The scheduler's dispatcher now reports every request (`note`); a `disable` stays in force."""
        if self.disabled == NOT_INSTALLED:
            self.disabled = None

    def note(self, request) -> None:
        """Called by the scheduler's dispatcher before it runs `request`."""
        if not self._replies:
            return
        kind = type(request).__name__
        if kind not in READ_ONLY or (kind == "CheckWeightsReqInput" and
                                     getattr(request, "action", None) in WRITING_CHECK_ACTIONS):
            self._replies.clear()

    def disable(self, why: str) -> None:
        """Something writes the weights without a request from now on: never answer from the memo again."""
        self.disabled = why
        self._replies.clear()

    def hold(self, why: str) -> None:
        """A writer outside the requests is at work (a direct sync between its share and its close): no memo
        until `release`; a writer that never releases (a trainer killed mid-sync) leaves it off."""
        self.held = why
        self._replies.clear()

    def release(self) -> None:
        self.held = None
        self._replies.clear()

    def lookup(self, role: str, skip: list[str] | None) -> dict | None:
        reply = self._replies.get(_key(role, skip))
        if reply is None:
            return None
        self.hits += 1
        return copy.deepcopy(reply)  # the caller may change what it is given; the memo stays as computed

    @property
    def on(self) -> bool:
        return self.disabled is None and self.held is None

    def store(self, role: str, skip: list[str] | None, reply: dict) -> None:
        if self.on:
            self._replies[_key(role, skip)] = copy.deepcopy(reply)


def _key(role: str, skip: list[str] | None) -> tuple:
    return role, tuple(sorted(skip or ()))


MEMO = Memo()  # one per process: an engine's scheduler holds one model (and its draft, told apart by role)
