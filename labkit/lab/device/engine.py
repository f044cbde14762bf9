"""`labkit bench device`'s engine: a STAND-IN for SGLang's scheduler, in a process of its own, torch alone.

The GPU machine the device check runs on has no SGLang (its kernel wheel pins another torch), so the engine here
is not SGLang: it is a module whose parameters are shaped as SGLang's fused ones (`qkv_proj` with its row blocks,
`gate_up_proj` with `output_sizes`, FusedMoE's `w13_weight` [E, 2I, H] and `w2_weight` [E, H, I]) behind labkit's
real `LabkitWeights.param_view`, fed through labkit's real loader (labkit.engine.inside.apply: kept CUDA-IPC mappings,
the copy plan) from handles labkit's real serializer wrote (labkit.engine.ipc, read with SGLang's allowlist),
hashed by labkit's real checksum. What it cannot show: SGLang's scheduler round trip, its loaders, TP > 1.

Protocol (a Pipe; every request answers one reply): ("build", [(name, shape, dtype)]) -> parameters allocated;
("apply", payload) -> apply.load_flat, answering (deserialize s, apply s, storage pointer); ("end_sync",);
("checksums", algo); ("flip", name) (xor one bit of its first word: planted corruption, flipped back by a second
call); ("settle", bool) (apply.SETTLE: the hazard probe); ("free",); ("stop",).
"""

from __future__ import annotations

import time
import traceback
from types import SimpleNamespace

import torch
from torch import nn

from labkit.engine import ipc
from labkit.engine.inside import apply
from labkit.engine.inside import copyplan
from labkit.engine import checksum as ck
from labkit.engine.contract import fused_part
from labkit.engine.inside.sglang_models.weights import LabkitWeights


def engine_params(tensors: list[tuple[str, tuple[int, ...], str]]) -> dict[str, tuple[tuple[int, ...], str, list]]:
    """{engine parameter: (shape, dtype, row blocks)} for HF tensors, as SGLang's TP=1 model holds them: fused
    groups stacked on dim 0 in index order (verify.engine_layout's bytes), experts as FusedMoE's 3-D stacks."""
    groups: dict[str, list] = {}
    out: dict[str, tuple] = {}
    for name, shape, dtype in tensors:
        part = fused_part(name)
        if part is None:
            out[name] = (tuple(shape), dtype, [])
        else:
            groups.setdefault(part[0], []).append((part[1], tuple(shape), dtype))
    for name, parts in groups.items():
        parts.sort()
        rows = [s[0] for _, s, _ in parts]
        first, dtype = parts[0][1], parts[0][2]
        if name.endswith("w13_weight"):  # 2E parts of [I, H]
            shape = (len(parts) // 2, 2 * first[0], first[1])
        elif name.endswith("w2_weight"):  # E parts of [H, I]
            shape = (len(parts), *first)
        else:
            shape = (sum(rows), *first[1:])
        out[name] = (shape, dtype, rows)
    return out


class StandIn(LabkitWeights, nn.Module):
    """Parameters named and shaped as SGLang's model's; labkit's mixin maps HF names into them (`param_view`)."""

    def __init__(self, tensors: list[tuple[str, tuple[int, ...], str]], device: str):
        super().__init__()
        self.config = SimpleNamespace(tie_word_embeddings=False)
        for name, (shape, dtype, rows) in engine_params(tensors).items():
            path, _, attr = name.rpartition(".")
            owner = self._owner(path)
            owner.register_parameter(attr, nn.Parameter(torch.empty(shape, dtype=getattr(torch, dtype),
                                                                    device=device), requires_grad=False))
            if rows and not name.endswith(("w13_weight", "w2_weight")):
                owner.output_sizes = rows  # what `shard_sizes` reads off a fused linear

    def _owner(self, path: str) -> nn.Module:
        mod: nn.Module = self
        for part in path.split("."):
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        return mod


def serve(conn, device: str) -> None:
    """The engine process's loop: one reply per request, ("error", traceback) on failure, until "stop"."""
    if device == "cuda":
        torch.cuda.set_device(0)
    model = None
    while True:
        op, *args = conn.recv()
        try:
            if op == "stop":
                conn.send(("ok",))
                return
            if op == "build":
                t0 = time.perf_counter()
                model = StandIn(args[0], device)
                _sync(device)
                conn.send(("ok", time.perf_counter() - t0, sum(p.numel() * p.element_size()
                                                              for p in model.parameters())))
            elif op == "apply":
                conn.send(("ok", *_apply(model, args[0], device)))
            elif op == "end_sync":
                conn.send(("ok", apply.end_sync()))
            elif op == "checksums":
                t0 = time.perf_counter()
                sums = {n: ck.checksum(p.data, args[0]) for n, p in model.named_parameters()}
                conn.send(("ok", sums, time.perf_counter() - t0))
            elif op == "flip":
                word = model.get_parameter(args[0]).data.reshape(-1)[:1].view(torch.uint8)
                word.bitwise_xor_(1)
                conn.send(("ok",))
            elif op == "settle":
                apply.SETTLE = bool(args[0])
                conn.send(("ok",))
            elif op == "free":
                model = None
                _forget()
                conn.send(("ok",))
            else:
                conn.send(("error", f"unknown request {op!r}"))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _apply(model, payload: bytes, device: str) -> tuple[float, float, float, int]:
    """(deserialize s, apply s, of which the host's part before the copies' wait, storage pointer). The wait is
    the loader's own (`apply.settle`), taken apart here to time the two halves; the hazard probe turns it off."""
    settle, apply.SETTLE = apply.SETTLE, False
    try:
        t0 = time.perf_counter()
        named = ipc.loads(payload)
        t1 = time.perf_counter()
        apply.load_flat(model, named)
        t2 = time.perf_counter()
        if settle:
            apply.SETTLE = True
            apply.settle(named[0][1])
        t3 = time.perf_counter()
    finally:
        apply.SETTLE = settle
    return t1 - t0, t3 - t1, t2 - t1, named[0][1].untyped_storage().data_ptr()


def _forget() -> None:
    """Drop what the loader keeps between syncs (kept buffers, compiled plans): the next model starts clean."""
    apply.end_sync()
    while apply._mapped:
        apply._release(apply._mapped.popitem()[1][0])
    copyplan._plans.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()

