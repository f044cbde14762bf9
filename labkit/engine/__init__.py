"""SGLang rollout engine: one handle, two backends (in-process Engine in a Ray actor, or an HTTP server).

Importing this package is cheap: SGLang and Ray are imported where an engine is started.
"""

from labkit.engine.backend import EngineBackend
from labkit.engine.config import EngineConfig
from labkit.engine.contract import Contract, ContractMismatch
from labkit.engine.errors import EngineError, EngineUnreachable, Unsupported
from labkit.engine.handle import EngineHandle, check_model_dir

__all__ = ["Contract", "ContractMismatch", "EngineBackend", "EngineConfig", "EngineError", "EngineHandle",
           "EngineUnreachable", "Unsupported", "check_model_dir"]
