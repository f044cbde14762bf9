"""transport="direct" without an engine: the share answer (labkit.engine.inside.direct) and the trainer's mappings of it
(labkit.sync.transports.direct.Mappings) write into the very storage a model serves."""

import json

import pytest
import torch

from labkit.engine.inside import direct
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
        tok = direct.token(model, ["q", "k", "down", "tied"])
        assert tok and direct.holds(model, tok) and not direct.holds(Model(), tok)  # another model: nothing holds
        model.qk = torch.nn.Parameter(torch.ones(6, 4), requires_grad=False)  # re-created (a post-load repack)
        assert not direct.holds(model, tok)  # the trainer must ask in full: its view of q/k is the old file's
        again = direct.share(model, ["q", "k", "down", "tied"])
        assert direct.token(model, ["q", "k", "down", "tied"]) not in (None, tok)
        assert again is not entries and again[0][1] != entries[0][1]  # a new file for the new storage
        with pytest.raises(ValueError, match=r"q: the engine's share answer .* does not fit its file"):
            Mappings().views([[*again[0][:2], 8, *again[0][3:]]])  # a storage smaller than the slice it claims
        maps.views(again)["q"].copy_(torch.zeros(2, 4))
        assert float(model.qk[:2].abs().sum()) == 0.0
        assert again[0][1] in maps.files and entries[0][1] not in maps.files  # the re-created one's old file let go
    finally:
        maps.close()


def test_a_later_sync_asks_by_token_and_the_engine_answers_in_full_only_when_it_must(tmp_path):
    """The engine's side of the short question (`answer` with AGAIN) and the trainer's kept token (`Mappings.kept`):
    one round trip while nothing changed, the full answer after a parameter was re-created."""
    model, maps, names = Model(), Mappings(), ["q", "k", "down"]
    request = tmp_path / "req.json"
    request.write_text('["q", "k", "down"]')
    try:
        assert direct.answer(model, direct.SHARE_PREFIX + str(request)) == [[3]]
        full = json.loads((tmp_path / "req.json.out").read_text())
        maps.views(full["entries"], full["token"], names)
        assert maps.kept(names) == full["token"] and maps.kept(["q"]) is None  # another plan asks in full
        assert direct.answer(model, direct.SHARE_PREFIX + direct.AGAIN + full["token"]) == [[1]]
        assert direct.answer(model, direct.SHARE_PREFIX + direct.AGAIN + "not-a-token") == [[0]]
        model.down = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16), requires_grad=False)
        assert direct.answer(model, direct.SHARE_PREFIX + direct.AGAIN + full["token"]) == [[0]]
        maps.close()
        assert maps.kept(names) is None
    finally:
        maps.close()


def test_an_engine_at_tp_above_one_or_without_param_view_shares_nothing():
    assert direct.share(Model(), ["q"], tp_size=2) == []
    assert direct.share(torch.nn.Linear(2, 2), ["weight"]) == []


def test_done_payload_names_round_trip():
    names = ["model.layers.0.self_attn.kv_b_proj.weight", "lm_head.weight"]
    key = direct.done_key(names)
    assert key.startswith(direct.DONE_PREFIX) and direct.written(key) == names
