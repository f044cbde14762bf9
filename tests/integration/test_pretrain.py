"""`labkit pretrain`'s two stages on the real Megatron trainer, a few steps each: the post-training stage moves
the trunk and leaves the MTP draft exactly as stage 1 left it (the stale draft RL starts from), and a rebuild
is bit for bit."""

from safetensors.torch import load_file

from labkit.config import ModelSpec
from labkit.lab.pretrain import pretrain

SPEC = ModelSpec(hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, mtp_layers=1, seed=0)


def _weights(d):
    return load_file(str(d / "model.safetensors"))


def test_post_training_moves_the_trunk_not_the_draft_and_rebuilds_bit_for_bit(tmp_path):
    kw = {"spec": SPEC, "steps": 3, "warmup": 1, "batch_size": 8, "progress": False}
    for name, post in (("one", 0), ("two", 2), ("again", 2)):
        pretrain(tmp_path / name, post_steps=post, **kw)
    one, two, again = (_weights(tmp_path / n) for n in ("one", "two", "again"))
    assert one.keys() == two.keys() == again.keys()
    draft = [n for n in one if n.startswith("model.mtp_layers.")]
    assert draft and all(one[n].equal(two[n]) for n in draft)
    moved = [n for n in one if n not in draft and not one[n].equal(two[n])]
    assert "model.layers.0.self_attn.q_proj.weight" in moved and "lm_head.weight" in moved
    assert all(two[n].equal(again[n]) for n in two)
