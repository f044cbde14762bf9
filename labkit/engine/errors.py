"""Errors of the engine layer. Every failure SGLang reports as (success=False, message) becomes an EngineError."""

from __future__ import annotations


class EngineError(RuntimeError):
    """SGLang refused or failed a call; the message carries SGLang's own text."""


class EngineUnreachable(EngineError):
    """No engine answered at the given URL (or the engine actor died) within the bounded timeout."""


class Unsupported(EngineError, NotImplementedError):
    """The call cannot work on this machine; raised before SGLang is asked (asking would crash or hang it)."""


class PortTaken(EngineError):
    """An HTTP server could not bind the port labkit picked for it: another process took the port between the pick
    and the bind. Its uvicorn logs the bind error and the process stays up, so without this the start waited out
    its whole timeout (make test from a fresh clone at 7b0174f: 300 s, then three tests errored)."""
