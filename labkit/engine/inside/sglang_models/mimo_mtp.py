"""SGLang's MiMoMTP (the draft model of a speculative MiMo engine) plus labkit's weight access.

Registered here so that the draft runner resolves its architecture from labkit's model package instead of
SGLang's whole model zoo, and so that labkit's copy plan writes the synced MTP tensors straight into the draft
runner's parameters (`param_view`, names from labkit.engine.draft). Every tensor the draft runner does not hold,
or shares with the target (the vocabulary tables: SGLang hands the draft the target's own after load), is the
target runner's to write: `NOTHING` here, so the same bucket applied to both runners writes each byte once and a
delta sync applies to both (labkit.engine.inside.apply). The forward is SGLang's own.
"""

from __future__ import annotations

from sglang.srt.models.mimo_mtp import MiMoMTP as _SGLangMiMoMTP

from labkit.engine import draft
from labkit.engine.inside import runners
from labkit.engine.inside.sglang_models.weights import LabkitWeights
from labkit.engine.inside.shardview import NOTHING


class MiMoMTP(LabkitWeights, _SGLangMiMoMTP):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        runners.add_draft(self)  # a ring sync applies to it from the target's call (labkit.engine.inside.runners)

    def param_view(self, name: str):
        local = draft.local_name(name)
        if local is None or local in draft.SHARED:
            return name, NOTHING
        return super().param_view(local)


EntryClass = MiMoMTP
