"""Trainer and engine on one host, one copy: the trainer writes into the engine's parameters."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from labkit import failpoints as fp
from labkit.engine.inside import direct as engine_side
from labkit.engine import ipc
from labkit.engine.config import APPLY_FORMAT
from labkit.engine.errors import Unsupported
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket, Plan
from labkit.sync.transports.per_tensor import send_per_call

SHM = Path("/dev/shm")


class Direct:
    """transport="direct": no flat buffer and no engine-side apply; each exported tensor is copied (cast to the engine
    dtype on the way) straight into its slice of the engine's parameter (labkit.engine.inside.direct).

    Flow:
    1. open: refuse anything but a CPU engine at TP=1 with labkit's loader, before a byte moves;
    2. the first send asks the engine to share the parameters holding the plan's tensors (`EngineHandle.share_params`:
       it moves their storages into shared-memory files in place, once, and answers file, offset, dtype, shape per
       tensor; a model that cannot is refused there, still before a byte moves); a later sync asks only whether that
       answer still holds (`shared_still`, one round trip); each file is mapped once (`Mappings`, kept across syncs; a
       file the engine no longer names, e.g. after a restart, is let go) and a typed view built per tensor. Then, per
       bucket (on the syncer's worker thread, so the next bucket gathers meanwhile): `view.copy_` for each shared tensor
       (a strided view where the engine padded the block); the others (a tied lm_head) in one
       `update_weights_from_tensor` call per call group, through SGLang's `load_weights`;
    3. close: one call naming the tensors written (`DONE_PREFIX`), so the model re-derives what it computes from its
       weights at load; `apply_path` is "direct", or "mixed" when some went through the loader.
    Memory: no buffers at all (the engine's parameters are the receive side); one cast copy per fallback tensor."""

    name = "direct"
    flattened = False
    port_retries = 0
    same_node = True

    def __init__(self, maps: Mappings):
        self.maps = maps
        self.views: dict[str, torch.Tensor] | None = None  # the first send() asks the engine
        self.written: list[str] = []
        self.fallback = 0
        self.apply_path = "direct"
        self.share = None  # `sync/direct_share`: "asked" (the full answer) or "kept" (the earlier one still held)

    def open(self, engine, plan: Plan) -> None:
        if torch.cuda.is_available() or engine.device != "cpu" or engine.tp_size != 1:
            raise Unsupported("transport='direct' writes into a CPU engine's parameters at TP=1 (on a GPU the same "
                              "design is a CUDA-IPC handle per parameter, not built here): use 'colocated'")
        if not engine.accepts(APPLY_FORMAT):
            raise Unsupported(f"transport='direct' needs labkit's loader ({APPLY_FORMAT}) on the engine: "
                              "use 'colocated'")
        self.serializer, self.names = ipc.Serializer, [t.name for t in plan.tensors]

    def _handshake(self, engine) -> float:
        """The engine's share answer, checked on every sync (a restarted engine, a re-created parameter answer other
        files) and charged to "transfer" (what each sync pays, not one-off setup): the answer kept from an earlier sync
        of the same plan is reused while the engine says its token still holds (one round trip), else asked in full."""
        t0 = time.perf_counter()
        kept = self.maps.kept(self.names)
        if kept is not None and engine.shared_still(kept):
            self.views, self.share = self.maps.built, "kept"
            return time.perf_counter() - t0
        answer = engine.share_params(self.names)
        if answer is None:
            raise Unsupported("transport='direct': the engine's model does not share its parameters (labkit's "
                              "model classes do): use 'colocated'")
        self.views, self.share = self.maps.views(answer["entries"], answer["token"], self.names), "asked"
        return time.perf_counter() - t0

    def send(self, engine, b: Bucket, tensors: dict[str, torch.Tensor], flat=None) -> dict:
        handshake = self._handshake(engine) if self.views is None else 0.0
        t0 = time.perf_counter()
        fp.hit("transport.send", flat=None)
        rest = []  # not shared by the engine (a tied lm_head): through SGLang's load_weights
        for meta in b.tensors:
            t, view = tensors[meta.name].detach(), self.views.get(meta.name)
            if view is None:
                rest.append(meta)
                continue
            if tuple(t.shape) != tuple(view.shape) or str(view.dtype) != f"torch.{meta.dtype}":
                raise ValueError(f"{meta.name}: the engine holds {tuple(view.shape)} {view.dtype}, the plan sends "
                                 f"{tuple(t.shape)} {meta.dtype}")
            view.copy_(t)
            self.written.append(meta.name)
        send_per_call(engine, rest, tensors)
        self.fallback += len(rest)
        return {"load": time.perf_counter() - t0, "transfer": handshake}

    def close(self, engine) -> None:
        if self.written:
            done = [(engine_side.done_key(self.written), torch.zeros(1, dtype=torch.uint8))]
            payload = self.serializer.serialize(done, output_str=True)
            engine.update_weights_from_tensor([payload], load_format=APPLY_FORMAT, flush_cache=False)
        self.apply_path = "load_weights" if not self.written else "mixed" if self.fallback else "direct"


class Mappings:
    """The engine's shared parameter files, mapped once (MAP_SHARED, outside torch's shm manager, so a dead
    engine's file can be let go without its manager) and kept across syncs: mapping afresh would page-fault the
    whole model in again on every sync. Lives on the Syncer."""

    def __init__(self):
        self.files: dict[str, torch.Tensor] = {}  # shm file name -> its whole mapping (uint8)
        self.answer: list | None = None  # the last share answer and its views, reused while the engine repeats it
        self.built: dict[str, torch.Tensor] = {}
        self.token: tuple[str, tuple[str, ...]] | None = None  # (the answer's token, the names it was asked for)

    def kept(self, names: list[str]) -> str | None:
        """The token of the answer these views were built from, if it was asked for exactly `names`."""
        return self.token[0] if self.token is not None and self.token[1] == tuple(names) else None

    def views(self, entries: list[list], token: str | None = None, names=()) -> dict[str, torch.Tensor]:
        """{HF name: typed (possibly strided) view into the engine's parameter} for the engine's share answer
        (`token`: what the engine names that answer by, for `kept`)."""
        if entries != self.answer:
            self.close(keep={e[1] for e in entries})
            out = {}
            for name, file, size, offset, dtype, shape, strides in entries:
                whole = self.files.get(file)
                if whole is None:
                    path = SHM / file.lstrip("/")
                    whole = self.files[file] = torch.from_file(str(path), shared=True, size=os.path.getsize(path),
                                                               dtype=torch.uint8)
                dt = bk.torch_dtype(dtype)
                start = whole.numel() - size + offset  # torch's refcount header precedes the storage's bytes
                if start % dt.itemsize or start + _extent(shape, strides) * dt.itemsize > whole.numel():
                    raise ValueError(f"{name}: the engine's share answer ({offset=}, {shape=}, {strides=}) does not "
                                     f"fit its file {file} of {size} bytes")
                out[name] = torch.empty(0, dtype=dt).set_(whole.untyped_storage(), start // dt.itemsize, shape, strides)
            self.answer, self.built = entries, out
        self.token = (token, tuple(names)) if token else None  # only once every view is built
        return self.built

    def close(self, keep: set[str] = frozenset()) -> None:
        """Let go of every mapping not in `keep`, and remove the files whose engine is gone (nobody else will:
        labkit.compat.sglang.cleanup_shm leaves a file alone while this process maps it)."""
        dropped = [f for f in self.files if f not in keep]
        self.answer, self.built, self.token = None, {}, None
        for f in dropped:
            del self.files[f]
        if dropped:
            from labkit.compat.sglang import cleanup_shm

            cleanup_shm()


def _extent(shape, strides) -> int:
    """Elements from a view's first element to one past its last."""
    return 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
