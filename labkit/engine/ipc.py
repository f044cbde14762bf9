"""Tensor handles across processes, as SGLang's serializer writes and reads them, with torch alone.

A colocated sync sends a handle to a flat buffer, never its bytes: a shared-memory file name on CPU (torch's
`file_system` strategy), a CUDA IPC handle on GPU. `dumps` writes what SGLang's `MultiprocessingSerializer`
writes (torch's ForkingPickler, so SGLang's engine reads it unchanged) without importing SGLang; `loads` reads
it back in a process without SGLang (labkit bench device's engine stand-in) and admits only the globals SGLang
0.5.23's `SafeUnpickler` admits (`ALLOWED`; `sglang/srt/utils/common.py`), so a payload that would be refused
there is refused here first.

Device UUIDs. torch's CUDA handle names the device by its index in the sender's process. On a multi-GPU node the
trainer and the engine ranks see different device orders (CUDA_VISIBLE_DEVICES, Ray's per-actor remapping), so
index 3 in one process is another GPU in the next, and the engine would open the handle on the wrong device.
SGLang's engines patch torch's rebuild to accept a device UUID in that slot (`monkey_patch_torch_reductions`,
`utils/patch_torch.py`, called by its TP workers before any weight update; slime patches its trainer the same
way). `dumps` puts the UUID there without patching torch in the trainer's process, through its own dispatch
table; `loads` maps it back to this process's index.
"""

from __future__ import annotations

import base64
import copyreg
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as tmp
from torch.multiprocessing import reductions

DEVICE_ARG = 6  # the device's position in torch's CUDA rebuild arguments (SGLang's _REDUCE_TENSOR_ARG_DEVICE_INDEX)

_R, _U = "torch.multiprocessing.reductions", "torch._utils"
# The globals a labkit payload carries, each in SGLang 0.5.23's SafeUnpickler.ALLOWED_GLOBALS
# (tests/unit/test_ipc.py checks both: the list against SGLang's, and real payloads against the list).
ALLOWED = frozenset({
    ("builtins", "list"), ("builtins", "tuple"), ("builtins", "dict"), ("builtins", "str"), ("builtins", "int"),
    ("collections", "OrderedDict"), ("copyreg", "__newobj__"), ("torch", "Size"), ("torch", "device"),
    ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"), ("torch.storage", "UntypedStorage"),
    ("torch.storage", "TypedStorage"), ("torch", "UntypedStorage"), (_U, "_rebuild_tensor_v2"),
    (_U, "_rebuild_parameter"), (_R, "rebuild_tensor"), (_R, "rebuild_cuda_tensor"), (_R, "rebuild_storage_fd"),
    (_R, "rebuild_storage_filename"), (_R, "rebuild_storage_empty"), (_R, "rebuild_typed_storage"),
    (_R, "rebuild_typed_storage_child"), ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"),
    *(("torch", d) for d in ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                             "float64", "bool", "float8_e4m3fn", "float8_e5m2")),
})


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def device_index(device: int | str) -> int:
    """This process's index of a device named by index (torch's own handles) or UUID (labkit's, SGLang's)."""
    if isinstance(device, int):
        return device
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == device:
            return i
    raise ValueError(f"CUDA IPC handle names device {device!r}, which this process does not see "
                     f"({torch.cuda.device_count()} devices visible): check CUDA_VISIBLE_DEVICES on both sides")


def _reduce_tensor(t: torch.Tensor):
    fn, args = reductions.reduce_tensor(t)
    if t.is_cuda and len(args) > DEVICE_ARG and isinstance(args[DEVICE_ARG], int):
        args = (*args[:DEVICE_ARG], device_uuid(args[DEVICE_ARG]), *args[DEVICE_ARG + 1:])
    return fn, args


def _dispatch_table() -> dict:
    tmp.set_sharing_strategy("file_system")  # CPU: a handle names a shm file (the fd handshake kills SGLang)
    table = copyreg.dispatch_table.copy()
    table.update(ForkingPickler._extra_reducers)  # torch's reducers for tensors and storages
    for cls in (torch.Tensor, torch.nn.Parameter):
        table[cls] = _reduce_tensor
    return table


def dumps(obj) -> bytes:
    """`obj` (tensors inside) as SGLang's `MultiprocessingSerializer.serialize(obj)` would write it, with device
    UUIDs in CUDA handles."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _dispatch_table()
    p.dump(obj)
    return buf.getvalue()


def dumps_str(obj) -> str:
    """`dumps` in base64, as `serialize(obj, output_str=True)` writes it (what goes into an HTTP/JSON call)."""
    return base64.b64encode(dumps(obj)).decode()


def _rebuild_cuda_tensor(*args):
    args = (*args[:DEVICE_ARG], device_index(args[DEVICE_ARG]), *args[DEVICE_ARG + 1:])
    return reductions.rebuild_cuda_tensor(*args)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"labkit ipc: global {module}.{name} is not one a labkit payload carries "
                                         "(SGLang's SafeUnpickler admits a superset of these)")
        if name in ("rebuild_cuda_tensor", "_rebuild_cuda_tensor_modified"):
            return _rebuild_cuda_tensor
        return super().find_class(module, name)


def loads(data: bytes | str):
    """What `dumps` (or SGLang's serializer) wrote: handles opened in this process (a CUDA handle on the
    device its UUID names here; torch keeps an opened handle for as long as a tensor on it lives)."""
    if isinstance(data, str):
        data = base64.b64decode(data)
    return _Unpickler(io.BytesIO(data)).load()


class Serializer:
    """SGLang's `MultiprocessingSerializer.serialize` signature over `dumps`: what the transports call."""

    @staticmethod
    def serialize(obj, output_str: bool = False) -> bytes | str:
        return dumps_str(obj) if output_str else dumps(obj)


# An fp8 tensor crosses to the actor as its bytes and its dtype's name: Ray pickles tensors with plain pickle, and
# torch 2.14 cannot load a float8 tensor pickled that way (`serialization.py:1836`: "type object
# 'torch.storage.UntypedStorage' has no attribute 'dtype'"), which stopped the guard's restore of an FP8 engine.
_RAW = "labkit-raw"


def to_ray(payload: list) -> list:
    """A payload with each (name, fp8 tensor) as (name, (_RAW, its uint8 view, its dtype's name)); all else as is."""
    return [(p[0], (_RAW, p[1].view(torch.uint8), str(p[1].dtype).removeprefix("torch.")))
            if isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], torch.Tensor)
            and p[1].dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else p for p in payload]


def from_ray(payload: list) -> list:
    """`to_ray`'s inverse, in the actor."""
    return [(p[0], p[1][1].view(getattr(torch, p[1][2]))) if isinstance(p, tuple) and len(p) == 2
            and isinstance(p[1], tuple) and len(p[1]) == 3 and p[1][0] == _RAW else p for p in payload]
