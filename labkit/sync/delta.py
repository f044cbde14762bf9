"""Delta sync, the trainer's side: a copy of what the engine holds, bucket by bucket, and the words sent.

`SyncConfig.delta = N` (N >= 1): each bucket, packed in the engine's dtype as usual, is compared word by word with the
copy of what this trainer last sent; only the changed words cross (a change mask or their indices,
labkit.engine.inside.delta) and labkit's engine-side loader writes them in (labkit.engine.inside.apply). Worth it where
the engine serves a narrower dtype than the trainer's fp32 master weights: after a small step most bf16 words round to
what they were (verl PR #6974: 0.8-2.6 % changed; slime's delta doc ~3 %).

The copy is trusted only while nothing else could have changed the engine; otherwise the next sync is an anchor (every
byte, and a fresh copy):
- a new plan (bucket size, tensor list);
- `N` syncs since the last anchor (a full sync bounds how long an undetected drift could last);
- an engine weight version other than the copy's: a restarted engine, the atomic guard's rollback, another writer;
- the last sync's engine applied some tensors through SGLang's `load_weights` (`sync/apply_path` not `copy_plan`: TP>1,
  a tensor the model cannot map): a delta cannot reach those, so every sync is full;
- a failed or unverified sync drops the copy; it is trusted again only once a sync commits (between `begin` and `commit`
  it is already ahead of the engine).
A delta sync is verified against the trainer's full export (labkit.sync.hooks), not against what was sent: a wrong delta
cannot verify. Memory: one engine-dtype model on the trainer's host (the copy) plus one payload buffer of a bucket.
Version names tie the copy to the engine: two writers that name versions alike (two engines synced alternately by one
trainer, or two Syncers on one rank, e.g. syncs with and without `exclude=`) can make a copy look current when it is
not. Verification then fails and the guard restores the engine (an unverified sync would not notice): use delta=0 there.
"""

from __future__ import annotations

from labkit.engine.inside import delta as codec
from labkit.engine.inside.apply import delta_key
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket, Plan


class DeltaState:
    """The copy a delta is computed against, and this sync's counts. Lives on the Syncer, across syncs."""

    def __init__(self, anchor_every: int, device: str = "cpu"):
        """`device`: where the flat buckets live (the payload buffer goes there; shared memory on CPU)."""
        self.anchor_every, self.device = anchor_every, device
        self.shadows: dict[int, object] = {}  # bucket index -> uint8 copy of what the engine holds
        self.plan: Plan | None = None
        self.version: str | None = None  # the engine weight version the copy equals
        self.since_anchor = 0
        self.anchor, self.reason = True, "no copy of the engine's weights"  # anchor: every byte, and why
        self.pool: bk.BufferPool | None = None
        self.words = self.changed = self.wire = 0
        self.by_plan = True  # the last committed sync was applied by labkit's copy plan throughout

    def begin(self, plan: Plan, engine_version: str | None) -> None:
        """Decide whether this sync is an anchor (every byte) or a delta."""
        reasons = [("no copy of the engine's weights", self.version is None), ("new plan", plan is not self.plan),
                   (f"engine at {engine_version!r}, copy of {self.version!r}", engine_version != self.version),
                   (f"anchor every {self.anchor_every}", self.since_anchor + 1 >= self.anchor_every),
                   ("the engine applies some tensors through load_weights", not self.by_plan)]
        self.reason = next((r for r, hit in reasons if hit), "")
        self.anchor = bool(self.reason)
        if plan is not self.plan:
            self.shadows.clear()
        self.plan = plan
        self.since_anchor = 0 if self.anchor else self.since_anchor + 1
        self.words = self.changed = self.wire = 0
        self.version = None  # the copy runs ahead of the engine from the first bucket until `commit`
        normal = max((b.nbytes for b in plan.buckets if not b.oversize), default=1)
        if not self.anchor and (self.pool is None or self.pool.nbytes < normal):
            if self.pool is not None:
                self.pool.close()
            self.pool = bk.BufferPool(normal, device=self.device, shared=self.device == "cpu",
                                      slots=1)  # send() runs one bucket at a time

    def encode(self, b: Bucket, flat, layout: str) -> tuple[object, str]:
        """(payload, its name) for bucket `b` packed in `flat`; the copy is brought up to `flat` either way."""
        word = codec.word_bytes(bk.torch_dtype(t.dtype).itemsize for t in b.tensors)
        n = flat.numel() // word
        self.words += n
        shadow, r = self.shadows.get(b.index), None
        if shadow is None or shadow.numel() != flat.numel():
            self.shadows[b.index] = flat.clone()
        elif self.anchor or b.oversize:  # an oversize bucket travels whole: no payload buffer its size is kept
            shadow.copy_(flat)
        else:
            r = codec.encode(flat, shadow, word, self.pool.take())  # None: not smaller than the bucket
        if r is None:  # sent whole
            self.changed += n
            self.wire += flat.numel()
            return flat, layout
        self.changed += r[1]
        self.wire += r[0].numel()
        return r[0], delta_key(layout, word, n, r[2])

    def commit(self, version: str, apply_path: str = "copy_plan") -> None:
        """The sync landed (verified, or verification was off): the copy is what the engine holds."""
        self.version, self.by_plan = version, apply_path == "copy_plan"

    def drop(self) -> None:
        """The sync failed or did not verify: the engine may hold anything; the next sync is an anchor."""
        self.version, self.shadows = None, {}

    def metrics(self) -> dict:
        return {"sync/delta": "anchor" if self.anchor else "delta", "sync/delta_reason": self.reason,
                "sync/changed_fraction": round(self.changed / max(self.words, 1), 6), "sync/wire_bytes": self.wire,
                "sync/delta_shadow_bytes": sum(s.numel() for s in self.shadows.values())}

    def close(self) -> None:
        self.shadows.clear()
        if self.pool is not None:
            self.pool.close()
            self.pool = None

