"""labkit.engine.draft: the draft runner's names for synced tensors, and its checksums mirrored from the target's
so that a sync into a speculative engine is verified on the draft the engine runs."""

from labkit.engine import draft
from labkit.sync.verify import compare

TARGET = {"model.embed_tokens.weight": "e", "lm_head.weight": "h", "model.layers.0.mlp.down_proj.weight": "d",
          "model.mtp_layers.0.input_proj.weight": "p", "model.mtp_layers.0.self_attn.qkv_proj.weight": "q",
          "model.mtp_layers.0.final_layernorm.weight": "f"}
DRAFT = {"draft.model.embed_tokens.weight": "e", "draft.lm_head.weight": "h", "draft.model.input_proj.weight": "p",
         "draft.model.mtp_block.self_attn.qkv_proj.weight": "q", "draft.model.final_layernorm.weight": "f"}


def test_mimo_names_follow_sglangs_mimomtp():
    assert draft.local_name("model.mtp_layers.0.token_layernorm.weight") == "model.token_layernorm.weight"
    assert draft.local_name("model.mtp_layers.0.self_attn.q_proj.weight") == "model.mtp_block.self_attn.q_proj.weight"
    assert draft.local_name("model.mtp_layers.0.input_layernorm.weight") == "model.mtp_block.input_layernorm.weight"
    assert draft.local_name("model.layers.0.self_attn.q_proj.weight") is None
    assert draft.local_name("model.mtp_layers.1.input_proj.weight") is None  # the draft runs layer 0
    assert draft.local_name("lm_head.weight") == "lm_head.weight"
    for local in DRAFT:
        assert draft.local_name(draft.target_name(local[len("draft."):])) == local[len("draft."):]


def test_a_draft_that_kept_old_weights_fails_verification():
    ok = compare(TARGET, TARGET | DRAFT)
    assert ok["sync/verified"] and ok["verify/draft_checked"] == 3  # its own: not the tables it shares
    stale = compare(TARGET, TARGET | DRAFT | {"draft.model.input_proj.weight": "old"})
    assert not stale["sync/verified"] and stale["verify/mismatched"] == ["draft.model.input_proj.weight"]


def test_a_draft_parameter_nothing_mirrors_fails_and_an_engine_without_a_draft_is_unaffected():
    extra = compare(TARGET, TARGET | DRAFT | {"draft.model.mystery.weight": "x"})
    assert not extra["sync/verified"] and extra["verify/draft_unchecked"] == ["draft.model.mystery.weight"]
    left_out = {n: c for n, c in TARGET.items() if "input_proj" not in n}  # a sync that excluded it: unverified
    assert compare(left_out, TARGET | DRAFT)["sync/verified"]
    plain = compare(TARGET, TARGET)
    assert plain["sync/verified"] and plain["verify/draft_checked"] == 0


def test_a_speculative_engine_that_reports_no_draft_runner_fails_and_ranks_keep_their_suffix():
    assert not compare(TARGET, TARGET, draft_runner=True)["sync/verified"]
    ranked = {f"{k}#tp{r}": v for k, v in TARGET.items() for r in (0, 1)}
    ranked_draft = {f"{k}#tp{r}": v for k, v in DRAFT.items() for r in (0, 1)}
    m = compare(ranked, ranked | ranked_draft, draft_runner=True)
    assert m["sync/verified"] and m["verify/draft_checked"] == 6 and not m["verify/draft_unchecked"]
    assert draft.local_name("model.mtp_layers.0.input_proj.weight#tp1") == "model.input_proj.weight#tp1"
