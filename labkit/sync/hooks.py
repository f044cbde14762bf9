"""Per-bucket side work of a sync: what the syncer does with each bucket besides sending it.

A hook sees every bucket once it is handed to the transport (`on_bucket`: its exported tensors and, for the flattened
transports, the packed buffer, reused for bucket i+2, so what it keeps is copied now), answers its metrics once the
session is closed (`finish`) and gives back what it holds when the sync fails (`abort`); its time is charged to
`timing/sync/<phase>`. A new hook is a class and a line in `for_config`; the syncer's loop does not change.
"""

from __future__ import annotations

from typing import Protocol

import torch

from labkit.engine import checksum as ck
from labkit.engine.contract import NONE, part_counts, standalone
from labkit.engine.shard import Sharding
from labkit.sync import bucket as bk
from labkit.sync import lastgood
from labkit.sync import verify as vf
from labkit.sync.config import SyncConfig
from labkit.sync.plan import Bucket
from labkit.sync.slots import Slots
from labkit.sync.spec import sharding as sharding_in


class Hook(Protocol):
    phase: str  # the timing/sync/<phase> its time is charged to

    def on_bucket(self, b: Bucket, tensors: dict[str, torch.Tensor], flat: torch.Tensor | None) -> None: ...

    def finish(self, engine, version: str) -> dict: ...

    def abort(self) -> None:
        """Give back what it holds (default: nothing to give back)."""


def _engine_dtype(b: Bucket, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The EXPORTED tensors cast to the engine dtype (the packer's cast), never the packed buffer: a packing
    bug (wrong offset, wrong cast) then fails verification instead of being hashed into the expectation."""
    out = {}
    for m in b.tensors:  # a no-op `.to` per tensor was 5 % of an MoE sync's trainer time (4,179 tensors)
        t, want = tensors[m.name].detach(), bk.torch_dtype(m.dtype)
        out[m.name] = t if t.dtype == want else t.to(want)
    return out


class Checksums(Hook):
    """verify="checksum": the expected checksums, accumulated bucket by bucket, against the engine's."""

    phase = "verify"

    def __init__(self, sizes: dict[str, int] | None = None, ffn_pad: int = 1, algo: str = ck.DEFAULT,
                 alone: frozenset[str] = NONE, sharding: Sharding = vf.ONE, draft_runner: bool = False):
        self.expected = vf.Expected(sizes, ffn_pad, algo, alone, sharding)
        self.draft_runner = draft_runner  # a speculative engine: its draft runner is checked too

    def on_bucket(self, b, tensors, flat) -> None:
        self.expected.add(_engine_dtype(b, tensors))

    def finish(self, engine, version: str) -> dict:
        actual = engine.checksums()
        # The engine's checksums ride back under a private key: the atomic guard takes them as its "after"
        # instead of hashing the whole model again (~0.3 s of a 0.3 GB model on CPU); `sync()` drops the key.
        return {**vf.compare(self.expected.finish(), actual, self.draft_runner), vf.ENGINE_CHECKSUMS: actual}


class FullCopies(Hook):
    """verify="full": a host copy of every tensor sent, compared element-wise with what the engine serves."""

    phase = "verify"

    def __init__(self):
        self.kept: dict[str, torch.Tensor] = {}

    def on_bucket(self, b, tensors, flat) -> None:
        self.kept.update({n: t.to("cpu", copy=True) for n, t in _engine_dtype(b, tensors).items()})

    def finish(self, engine, version: str) -> dict:
        return vf.compare_full(self.kept, engine.get_weights_by_name)


class Stage(Hook):
    """The rollback copy of the version being sent (`lastgood.Writer` under `stage_dir`), written from the
    flat buffer before it is reused, or only indexed where the syncer packed the bucket into the copy itself
    (colocated, distributed on CPU); complete (index.json) only once the session closed."""

    phase = "stage"

    def __init__(self, stage_dir: str, slots: Slots | None = None, capacity: int = 0):
        self.writer = lastgood.Writer(stage_dir, slots, capacity)

    def on_bucket(self, b, tensors, flat) -> None:
        if flat is not None and self.writer.locate(flat) is not None:  # packed into the copy itself: index it
            self.writer.add_packed(bk.offsets(b), flat)
            return
        self.writer.add(dict(bk.unpack(b, flat)) if flat is not None else {
            m.name: tensors[m.name].detach().to("cpu", bk.torch_dtype(m.dtype)) for m in b.tensors})

    def finish(self, engine, version: str) -> dict:
        staged = self.writer.finish(version)
        return {"sync/staged": staged, "sync/stage_bytes": self.writer.nbytes}  # host memory (tmpfs) it holds

    def abort(self) -> None:
        self.writer.abort()


def stage_writer(hooks: list[Hook]) -> lastgood.Writer | None:
    """The rollback copy's writer, if it copies through a kept mapping (the syncer can pack buckets into it)."""
    return next((h.writer for h in hooks if isinstance(h, Stage) and h.writer.maps is not None), None)


def for_config(cfg: SyncConfig, plan=None, engine_spec: dict | None = None,
               slots: Slots | None = None) -> list[Hook]:
    """The hooks a sync runs, in order (verification answers before the rollback copy is completed). `plan`
    (labkit.sync.plan.Plan) tells the checksums how many parts fill each fused parameter, `engine_spec` the
    engine's FFN padding and the hash its checker runs; `slots`, the syncer's kept mappings of rollback copies."""
    sizes = part_counts(t.name for t in plan.tensors) if plan is not None else None
    alone = standalone(t.name for t in plan.tensors) if plan is not None else NONE
    spec = engine_spec or {}
    hooks: list[Hook] = []
    if cfg.verify == "full":
        hooks.append(FullCopies())
    elif cfg.verify != "none":
        hooks.append(Checksums(sizes, spec.get("ffn_pad", 1), spec.get("checksum", ck.DEFAULT), alone,
                               sharding_in(spec), bool(spec.get("draft"))))
    if cfg.stage_dir:
        capacity = plan.total_bytes + lastgood.ALIGN * len(plan.tensors) if plan is not None else 0
        hooks.append(Stage(cfg.stage_dir, slots, capacity))
    return hooks
