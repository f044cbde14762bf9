"""SGLang model classes registered through SGLang's own `SGLANG_EXTERNAL_MODEL_PACKAGE` hook.

Every module here defines `EntryClass`; SGLang's registry serves these for their architecture names and
imports its own model zoo only on demand (which also shortens engine start). The classes are SGLang's own
models with small additions; their forward is untouched (see each module for what its load path adds).
"""
