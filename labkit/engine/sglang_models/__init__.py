"""SGLang model classes registered through SGLang's own `SGLANG_EXTERNAL_MODEL_PACKAGE` hook.

Every module here defines `EntryClass`; SGLang's registry serves these for their architecture names and
imports its own model zoo only on demand (which also shortens engine start). The classes are SGLang's own
models with read-only additions; their forward and load paths are untouched.
"""
