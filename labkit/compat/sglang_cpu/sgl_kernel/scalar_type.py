"""`sgl_kernel.scalar_type` for the import-only placeholder: the real module is pure Python.

SGLang's quantization helpers (`get_scalar_types`, marlin/awq paths) import it. We execute the installed
sglang-kernel's own file when that wheel is present (its C extensions are never loaded), so the types stay
exactly upstream's. Without the wheel we raise ImportError, the case SGLang already falls back on.
"""

import importlib.util
import sys
from importlib import metadata


def _real_source():
    try:
        dist = metadata.distribution("sglang-kernel")
    except metadata.PackageNotFoundError:
        return None
    path = dist.locate_file("sgl_kernel/scalar_type.py")
    return path if path.is_file() else None


_src = _real_source()
if _src is None:
    raise ImportError("sgl_kernel.scalar_type: the sglang-kernel wheel is not installed (labkit placeholder)",
                      name=__name__)
_spec = importlib.util.spec_from_file_location(__name__, _src)
_mod = importlib.util.module_from_spec(_spec)
# dataclasses resolve annotations through sys.modules[cls.__module__]: register before executing.
sys.modules[__name__] = _mod
_spec.loader.exec_module(_mod)
