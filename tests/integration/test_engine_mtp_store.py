"""The engine-side MTP draft store (labkit/engine/inside/sglang_models/mimo.py) on the shared CPU engine: loaded
from safetensors, updated by every transport, hashed by SGLang's weight checker, read back by name."""

import pytest
import torch
from safetensors.torch import load_file

from labkit.engine import EngineError
from labkit.models import tokenizer
from labkit.sync.verify import expected_checksums

pytestmark = pytest.mark.integration

P = "model.mtp_layers.0"
# the engine's own names for the MTP layer (ENGINE_SPEC has one): HF names, q/k/v and gate/up fused
ENGINE_NAMES = {f"{P}.{n}" for n in (
    "token_layernorm.weight", "hidden_layernorm.weight", "input_proj.weight", "final_layernorm.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.qkv_proj.weight",
    "self_attn.qkv_proj.bias", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight")}
GREEDY = {"temperature": 0.0, "max_new_tokens": 8}


def _weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def _mtp(weights) -> dict[str, torch.Tensor]:
    return {n: t for n, t in weights.items() if n.startswith("model.mtp_layers.")}


def _perturbed(weights, names, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(n, weights[n] + 0.25 * torch.randn(weights[n].shape, generator=g)) for n in names]


def _in_session(engine, send):
    engine.begin_weight_update()
    try:
        send()
    finally:
        engine.end_weight_update()


def _tensor_update(engine, named):
    _in_session(engine, lambda: engine.update_weights_from_tensor(named))


def _bucket_update(engine, named):
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    # CPU tensor handles must name shm files: the default fd strategy's handshake fails across unrelated
    # processes (AuthenticationError in SGLang's scheduler, which then dies)
    torch.multiprocessing.set_sharing_strategy("file_system")
    bucket = FlattenedTensorBucket(named_tensors=[(n, t.clone()) for n, t in named])
    payload = MultiprocessingSerializer.serialize(
        {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}, output_str=True)
    _in_session(engine, lambda: engine.update_weights_from_tensor([payload], load_format="flattened_bucket"))


def _assert_engine_holds(engine, weights, named):
    """get_weights_by_name answers the sent tensors bitwise, and every checksum (trunk and MTP) is what
    `weights` with `named` applied hashes to in the engine's fused layout."""
    for n, t in named:
        got = engine.get_weights_by_name(n)
        assert got.shape == t.shape and torch.equal(got, t), f"{n}: engine tensor differs from the one sent"
    want = expected_checksums({**weights, **dict(named)})
    sums = engine.checksums()
    bad = sorted(n for n in want if sums.get(n) != want[n])
    assert not bad, f"checksums differ from the expected ones for {bad}"


def _roundtrip(engine, engine_model_dir, update, names, seed):
    weights = _weights(engine_model_dir)
    ids = [tokenizer.encode("hello world")]
    before = engine.generate(input_ids=ids, sampling=GREEDY)[0]["tokens"]
    sums0 = engine.checksums()
    new = _perturbed(weights, names, seed)
    try:
        update(engine, new)
        _assert_engine_holds(engine, weights, new)
        sums = engine.checksums()
        changed = sorted(n for n in sums if sums[n] != sums0[n])
        assert changed == sorted(expected_checksums(dict(new))), f"unexpected checksum changes: {changed}"
        if all(".mtp_layers." in n for n in names):  # the store is not part of forward: same served model
            assert engine.generate(input_ids=ids, sampling=GREEDY)[0]["tokens"] == before
    finally:  # the engine is shared with other tests: put the original weights back
        update(engine, [(n, weights[n]) for n in names])
    assert engine.checksums() == sums0


def test_mtp_store_loaded_from_safetensors(engine, engine_model_dir):
    mtp = _mtp(_weights(engine_model_dir))
    sums = engine.checksums()
    assert {n for n in sums if ".mtp_layers." in n} == ENGINE_NAMES
    want = expected_checksums(mtp)
    assert set(want) == ENGINE_NAMES
    assert {n: sums[n] for n in want} == want
    for n, t in mtp.items():  # HF names, shards sliced back out of the fused params
        assert torch.equal(engine.get_weights_by_name(n), t), n


def test_mtp_update_from_tensor(engine, engine_model_dir):
    names = [f"{P}.self_attn.q_proj.weight", f"{P}.mlp.up_proj.weight", f"{P}.self_attn.v_proj.bias",
             f"{P}.input_proj.weight", f"{P}.final_layernorm.weight"]
    _roundtrip(engine, engine_model_dir, _tensor_update, names, seed=1)


def test_mtp_update_from_flattened_bucket(engine, engine_model_dir):
    names = [f"{P}.self_attn.k_proj.weight", f"{P}.self_attn.q_proj.bias", f"{P}.mlp.gate_proj.weight",
             f"{P}.mlp.down_proj.weight", f"{P}.token_layernorm.weight",
             "model.layers.1.self_attn.k_proj.weight"]  # a trunk tensor in the same bucket goes to SGLang
    _roundtrip(engine, engine_model_dir, _bucket_update, names, seed=2)


def test_mtp_update_from_distributed_and_unknown_name(engine, engine_model_dir):
    import torch.distributed as dist
    # same directory (pytest's rootdir-relative import)
    from tests.integration.test_engine import _beside, _trainer_group

    from labkit.cluster.runtime import free_port

    port, group = free_port(), "labkit_test_mtp"
    join = _beside(_trainer_group, port, group)
    engine.init_weights_update_group("127.0.0.1", port, rank_offset=1, world_size=2, group_name=group)
    pg = join()

    def broadcast(named):
        def send():
            join = _beside(lambda: [dist.broadcast(t, src=0, group=pg) for _, t in named])
            try:
                engine.update_weights_from_distributed([n for n, _ in named], ["float32"] * len(named),
                                                       [list(t.shape) for _, t in named], group_name=group)
            finally:
                join()
        _in_session(engine, send)

    try:
        names = [f"{P}.self_attn.v_proj.weight", f"{P}.mlp.up_proj.weight", f"{P}.hidden_layernorm.weight"]
        _roundtrip(engine, engine_model_dir, lambda e, named: broadcast(named), names, seed=3)
        sums = engine.checksums()
        # Unknown names are refused before any byte moves, so nothing is broadcast (a sender would hang).
        for bad in (f"{P}.self_attn.rotary.weight", "model.mtp_layers.7.input_proj.weight"):
            with pytest.raises(EngineError, match=bad.replace(".", r"\.") + ".*not a weight"):
                _in_session(engine, lambda: engine.update_weights_from_distributed(
                    [bad], ["float32"], [[4]], group_name=group))
        assert engine.checksums() == sums
    finally:
        engine.destroy_weights_update_group(group)
        dist.destroy_process_group(pg)
