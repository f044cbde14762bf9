"""transport="direct" without an engine: the share answer (labkit.engine.direct) and the trainer's mappings of it
(labkit.sync.transports.direct.Mappings) write into the very storage a model serves."""

import pytest
import torch

from labkit.engine import direct
from labkit.sync.transports.direct import Mappings


class Model(torch.nn.Module):
    """A fused q/k block (contiguous row slices) and a padded FFN block (a column slice: strided)."""

    def __init__(self):
        super().__init__()
        self.qk = torch.nn.Parameter(torch.zeros(6, 4), requires_grad=False)
        self.down = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16), requires_grad=False)

    def param_view(self, name):
        if name in ("q", "k"):
            return "qk", self.qk.data.narrow(0, 0 if name == "q" else 2, 2 if name == "q" else 4)
        if name == "down":
            return "down", self.down.data.narrow(1, 0, 5)
        return None


def test_the_trainer_writes_into_the_served_parameters_and_leaves_the_padding_alone():
    model, maps = Model(), Mappings()
    try:
        entries = direct.share(model, ["q", "k", "down", "tied"])
        assert [e[0] for e in entries] == ["q", "k", "down"]  # tied has no slice: SGLang's loader takes it
        assert model.qk.untyped_storage().is_shared()  # moved in place: the model runs on the shared file
        views = maps.views(entries)
        assert maps.views(entries) is views  # the same answer again: the views are reused
        views["k"].copy_(torch.arange(16.0).reshape(4, 4))
        views["q"].copy_(torch.full((2, 4), -1.0))
        assert torch.equal(model.qk[2:], torch.arange(16.0).reshape(4, 4)) and bool((model.qk[:2] == -1).all())
        views["down"].copy_(torch.full((4, 5), 0.3))  # cast to the engine's bf16 on the way, columns 5..7 padding
        want = torch.zeros(4, 8, dtype=torch.bfloat16)
        want[:, :5] = 0.3
        assert torch.equal(model.down.data, want)
        assert direct.share(model, ["q", "k", "down", "tied"]) is entries  # unchanged parameters: the kept answer
        model.qk = torch.nn.Parameter(torch.ones(6, 4), requires_grad=False)  # re-created (a post-load repack)
        again = direct.share(model, ["q", "k", "down", "tied"])
        assert again is not entries and again[0][1] != entries[0][1]  # a new file for the new storage
        with pytest.raises(ValueError, match=r"q: the engine's share answer .* does not fit its file"):
            Mappings().views([[*again[0][:2], 8, *again[0][3:]]])  # a storage smaller than the slice it claims
        maps.views(again)["q"].copy_(torch.zeros(2, 4))
        assert float(model.qk[:2].abs().sum()) == 0.0
        assert again[0][1] in maps.files and entries[0][1] not in maps.files  # the re-created one's old file let go
    finally:
        maps.close()


def test_an_engine_at_tp_above_one_or_without_param_view_shares_nothing():
    assert direct.share(Model(), ["q"], tp_size=2) == []
    assert direct.share(torch.nn.Linear(2, 2), ["weight"]) == []


def test_done_payload_names_round_trip():
    names = ["model.layers.0.self_attn.kv_b_proj.weight", "lm_head.weight"]
    key = direct.done_key(names)
    assert key.startswith(direct.DONE_PREFIX) and direct.written(key) == names
