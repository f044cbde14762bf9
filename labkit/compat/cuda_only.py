"""Keep CUDA-only extension packages from crashing imports on a machine without CUDA.

SGLang's full install brings wheels whose import loads a CUDA library unconditionally and fails with
OSError (not ImportError), which defeats the `try: import x / except ImportError` fallbacks in
megatron-core and SGLang. On a CPU-only machine labkit turns those imports into a plain ImportError.
"""

from __future__ import annotations

import importlib.abc
import sys

# Verified against the pinned stack (requirements.txt): each of these raises OSError at import without CUDA.
CUDA_ONLY = ("flash_mla",)


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in CUDA_ONLY:
            raise ImportError(f"{fullname} needs CUDA; import blocked by labkit.compat on a CPU-only machine",
                              name=fullname)
        return None


def apply() -> bool:
    """Install the import guard (idempotent). Returns True when it is active."""
    import torch

    if torch.cuda.is_available():
        return False
    if not any(isinstance(f, _Block) for f in sys.meta_path):
        sys.meta_path.insert(0, _Block())
    return True
