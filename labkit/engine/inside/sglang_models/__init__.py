"""SGLang model classes registered through SGLang's own `SGLANG_EXTERNAL_MODEL_PACKAGE` hook.

Every module here defines `EntryClass`; SGLang's registry serves these for their architecture names and
imports its own model zoo only on demand (which also shortens engine start). The classes are SGLang's own
models with small additions; their forward is untouched (see each module for what its load path adds).
"""

import sys as _sys

import torch as _torch

# SGLang imports this package in its scheduler (SGLANG_EXTERNAL_MODEL_PACKAGE), SGLang itself loaded by then and
# before any batch forms: the seeds apply to every batch. A process that uses labkit's weights mixin without
# SGLang (labkit bench device's engine stand-in) has nothing to patch, and importing SGLang there cost ~10 s.
if not _torch.cuda.is_available() and "sglang" in _sys.modules:
    from labkit.engine.inside import fp8_cpu as _fp8_cpu
    from labkit.compat import seeded as _seeded
    from labkit.compat import spec_cpu as _spec_cpu

    _seeded.patch_sampling_seeds()
    _fp8_cpu.apply()  # block-FP8 checkpoints served torch-natively (SGLang's CPU path needs AMX)
    _spec_cpu.apply()  # SGLang's EAGLE/NEXTN worker (the draft worker starts after the target's model loads)
