"""SGLang model classes registered through SGLang's own `SGLANG_EXTERNAL_MODEL_PACKAGE` hook.

Every module here defines `EntryClass`; SGLang's registry serves these for their architecture names and
imports its own model zoo only on demand (which also shortens engine start). The classes are SGLang's own
models with small additions; their forward is untouched (see each module for what its load path adds).
"""

import torch as _torch


def _sglang_here() -> bool:
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


# Imported in SGLang's scheduler before any batch forms: seeds apply to all. Where SGLang is absent (labkit bench
# device's engine stand-in uses the weights mixin) there is nothing to patch.
if not _torch.cuda.is_available() and _sglang_here():
    from labkit.compat import seeded as _seeded

    _seeded.patch_sampling_seeds()
