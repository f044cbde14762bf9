"""A speculative engine's runners, as labkit's loader sees them: the target's model and its draft runner's.

SGLang hands every weight update to the target runner and then to the draft runner (its fan-out,
`scheduler_components/weight_updater.py`), the same payload to each. A ring sync (labkit.engine.inside.ring) streams
its buckets once, over one socket, to whichever call opens it: without this the target's call would apply them all,
and the draft's call of the same ring would wait for buckets that never come, until the trainer's timeout failed the
sync. So the target's call applies each bucket to the drafts too (`applying`), and a draft's own call of a ring
already served returns at once (`served`). A draft that is alone in an update (SGLang's selector "draft") serves
the ring itself.
"""

from __future__ import annotations

import weakref
from collections import deque

_drafts: weakref.WeakSet = weakref.WeakSet()
_served: deque[str] = deque(maxlen=4)  # the latest ring keys a target's call served


def add_draft(model) -> None:
    """Register a draft runner's model (labkit's draft classes do, when SGLang builds them)."""
    _drafts.add(model)


def applying(model) -> list:
    """The models a ring sync opened by `model`'s call applies to: itself, and the drafts where it is a target."""
    return [model] if model in _drafts else [model, *_drafts]


def serve_ring(key: str, model, decode, apply) -> None:
    """Serve ring sync `key` (labkit.engine.inside.ring) from `model`'s call: each bucket's payload decoded once
    (`decode(bytes)`), then `apply(m, payload)` for every model in `applying(model)`; then the drafts' own calls
    of it return (`served`). The ring applies to the drafts whatever the update's runner selector: labkit's syncs
    update every runner (selector "all")."""
    from labkit.engine.inside import ring

    models = applying(model)

    def each(data: bytes) -> None:
        payload = decode(data)
        for m in models:
            apply(m, payload)

    ring.serve(key, each)
    _served.append(key)


def served(key: str, model) -> bool:
    """Whether `model` is a draft whose share of ring `key` its target's call applied already."""
    return model in _drafts and key in _served
