"""Model families through the whole path on the real stack: Megatron-core (via mbridge, gloo) builds, trains and
exports a Qwen3-MoE and a DeepSeek-V3 (MLA + MoE with a shared expert, biased routing, a first dense layer);
SGLang's CPU engine serves each; every transport lands the trained weights bitwise and greedy output follows the
trainer (for DeepSeek that also proves the engine re-derived MLA's w_kc/w_vc from the new kv_b_proj).

One engine per family, one family at a time (module-scoped, parametrized fixtures). The models are small but
have what breaks a sync on a real MoE checkpoint: per-expert HF tensors that SGLang fuses into `w13_weight` /
`w2_weight`, an expert width a CPU engine pads (16 -> 32), a vocabulary it pads (131 -> 192), and MLA's a-pair.
"""

import pytest
import torch

from labkit.config import ParallelSpec, TrainConfig
from labkit.models.families import FamilySpec, make_family, tensor_shapes
from labkit.sync import SyncConfig, sync
from tests.integration.conftest import started_engine

pytestmark = pytest.mark.integration

# qwen3: dense FFN 200, padded to 224 on a CPU engine, to 256 at TP 2 (rank 1: 72 real rows of 128)
FAMILIES = {"qwen3": ("qwen3", FamilySpec(vocab=131, ffn=200)),
            "qwen3-moe": ("qwen3-moe-tiny", FamilySpec(vocab=131, moe_ffn=16)),
            "deepseek-v3": ("deepseek-v3", FamilySpec(vocab=131, moe_ffn=16, dense_layers=1)),
            "moonlight": ("deepseek-v3", FamilySpec(vocab=131, hidden=80, heads=5, kv_heads=5, experts=6, moe_ffn=24,
                                                    shared_experts=2, q_lora=0, dense_layers=1))}
MOE_LAYERS = {"qwen3": 0, "qwen3-moe": 2, "deepseek-v3": 1, "moonlight": 1}
L1 = "model.layers.1"
READ_BACK = {"qwen3": (f"{L1}.mlp.up_proj.weight", f"{L1}.mlp.down_proj.weight"),
             "qwen3-moe": (f"{L1}.mlp.experts.5.up_proj.weight", f"{L1}.mlp.experts.7.down_proj.weight"),
             "deepseek-v3": (f"{L1}.mlp.experts.5.up_proj.weight", f"{L1}.self_attn.kv_a_proj_with_mqa.weight"),
             "moonlight": (f"{L1}.mlp.experts.5.up_proj.weight", f"{L1}.self_attn.q_proj.weight")}
PROBE = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def moe_dir(family, tmp_path_factory):
    preset, spec = FAMILIES[family]
    return make_family(preset, tmp_path_factory.mktemp(family) / family, spec)


@pytest.fixture(scope="module")
def moe_engine(moe_dir):
    with started_engine(moe_dir) as handle:
        yield handle


@pytest.fixture(scope="module")
def tp2_engine(family, moe_dir):
    """The family served at TP 2 (labkit.compat.cpu_tp), beside the TP 1 engine."""
    with started_engine(moe_dir, tp=2) as handle:
        yield handle


@pytest.fixture(scope="module")
def moe_trainer(moe_dir, moe_engine):
    from labkit.trainer.group import Trainer

    t = Trainer(str(moe_dir), ParallelSpec(), TrainConfig(lr=3e-3))
    yield t
    t.shutdown()


def _hf_logits(model_dir) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(PROBE).logits.float()


def _reload(model_dir, named):
    """A fresh transformers model holding `named` (written as a checkpoint: transformers 5 fuses experts at load)."""
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    out = model_dir.parent / "exported-model"
    shutil.copytree(model_dir, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))

    save_file({n: t.contiguous() for n, t in named}, str(out / "model.safetensors"))
    return AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()


def _train(trainer, steps: int, seed: int) -> list[float]:
    from labkit.tasks import arith

    return [trainer.train_step(*arith.batch(arith.problems(16, seed=seed + s)))["train/loss"] for s in range(steps)]


def test_moe_trainer_matches_transformers_and_exports_the_checkpoint(moe_trainer, moe_dir):
    from safetensors.torch import load_file

    ckpt = load_file(str(moe_dir / "model.safetensors"))
    exported = dict(moe_trainer.export())
    assert set(exported) == set(ckpt) and all(torch.equal(exported[n], ckpt[n]) for n in ckpt)
    assert dict(moe_trainer.export(fast=False)).keys() == exported.keys()  # mbridge's path: same names
    diff = (moe_trainer.forward(PROBE)["logits"] - _hf_logits(moe_dir)).abs().max().item()
    assert diff <= 1e-5, f"Megatron vs transformers logits differ by {diff}"
    losses = _train(moe_trainer, 3, seed=11)
    assert losses[-1] < losses[0], losses
    trained = moe_trainer.export()
    assert sum(not torch.equal(t, ckpt[n]) for n, t in trained) == len(ckpt)  # experts and router train too
    ref = _reload(moe_dir, trained)
    with torch.no_grad():
        want = ref(PROBE).logits.float()
        diff = (moe_trainer.forward(PROBE)["logits"] - want).abs().max().item()
    # float32 summation order differs between Megatron and transformers: 1e-5 relative to the largest logit
    tol = 1e-5 * max(1.0, want.abs().max().item())
    assert diff <= tol, f"after training, the export in a fresh transformers model differs by {diff} (> {tol})"


@pytest.mark.parametrize("transport", ["per-tensor", "colocated", "distributed", "direct"])
def test_every_transport_syncs_trained_experts_bitwise(transport, family, moe_trainer, moe_engine):
    from labkit.models.tokenizer import EOS, encode
    from labkit.tasks import arith

    before = moe_engine.checksums()
    _train(moe_trainer, 1, seed={"per-tensor": 1, "colocated": 2, "distributed": 3, "direct": 4}[transport])
    m = sync(moe_trainer, moe_engine, SyncConfig(transport=transport, bucket_mb=0.05, progress=False))
    assert m["sync/verified"] is True and m["sync/num_unverified"] == 0, m
    assert m["sync/num_tensors"] == len(tensor_shapes(*FAMILIES[family]))
    assert m["sync/num_buckets"] > 1
    # direct: every tensor written in place, the FFN blocks a CPU engine padded as strided views; DeepSeek
    # re-derives w_kc/w_vc after it (the greedy check below)
    assert m["sync/apply_path"] == {"per-tensor": "load_weights", "direct": "direct"}.get(transport, "copy_plan")
    after = moe_engine.checksums()
    experts = [n for n in after if n.endswith(("w13_weight", "w2_weight"))]
    assert len(experts) == 2 * MOE_LAYERS[family] and all(after[n] != before[n] for n in experts)
    ids = [encode(p.prompt) for p in arith.problems(4, seed=77)]
    got = moe_engine.generate(input_ids=ids, sampling={"temperature": 0, "max_new_tokens": 6})
    assert [o["tokens"] for o in got] == moe_trainer.greedy(ids, 6, eos_id=EOS)


def test_a_fused_slice_reads_back_by_its_hf_name_and_full_verification_passes(family, moe_trainer, moe_engine):
    m = sync(moe_trainer, moe_engine, SyncConfig(verify="full", progress=False))
    assert m["sync/verified"] is True and m["verify/num_checked"] == len(tensor_shapes(*FAMILIES[family]))
    exported, shapes = dict(moe_trainer.export()), tensor_shapes(*FAMILIES[family])
    for name in READ_BACK[family]:  # the checkpoint's extent of a padded block, a slice of a fused parameter
        got = moe_engine.get_weights_by_name(name)
        assert tuple(got.shape) == tuple(exported[name].shape) == shapes[name]
        assert torch.equal(got, exported[name])


def _greedy_follows(engine, trainer) -> bool:
    from labkit.models.tokenizer import EOS, encode
    from labkit.tasks import arith

    ids = [encode(p.prompt) for p in arith.problems(4, seed=78)]
    got = engine.generate(input_ids=ids, sampling={"temperature": 0, "max_new_tokens": 6})
    return [o["tokens"] for o in got] == trainer.greedy(ids, 6, eos_id=EOS)


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe", "deepseek-v3"], indirect=True)
@pytest.mark.parametrize("transport", ["colocated", "per-tensor", "distributed"])
def test_an_engine_at_tp2_takes_the_trained_weights_piece_by_piece_on_every_rank(transport, family, moe_trainer,
                                                                                tp2_engine):
    """Each rank holds its piece of every split tensor (K/V heads replicated where there are fewer than ranks,
    experts' widths split and padded, MLA's a-pair and the routers whole) and is verified against it; the copy
    plan writes each rank's piece; greedy follows the trainer (DeepSeek: w_kc/w_vc re-derived on each rank)."""
    _train(moe_trainer, 1, seed={"colocated": 31, "per-tensor": 32, "distributed": 33}[transport])
    m = sync(moe_trainer, tp2_engine, SyncConfig(transport=transport, bucket_mb=0.05, progress=False))
    assert m["sync/verified"] is True and m["sync/num_unverified"] == 0, m
    assert m["verify/num_checked"] == len(tp2_engine.checksums())  # every parameter of both ranks
    assert m["sync/apply_path"] == ("load_weights" if transport == "per-tensor" else "copy_plan")
    assert _greedy_follows(tp2_engine, moe_trainer)


@pytest.mark.parametrize("family", ["moonlight"], indirect=True)
def test_heads_a_tp2_engine_would_pad_are_refused_by_name(family, moe_dir):
    from labkit.engine.errors import Unsupported
    from labkit.sync.spec import sharding_of

    with pytest.raises(Unsupported, match="num_attention_heads=5 is not a multiple of the engine's tp=2"):
        sharding_of(str(moe_dir), 2)


@pytest.mark.parametrize("family", ["moonlight"], indirect=True)
def test_moonlight_syncs_into_a_bf16_engine_with_its_router_bias_held_in_float32(family, moe_dir, moe_trainer):
    """SGLang holds DeepSeek's router bias in float32 whatever the serving dtype (contract.FLOAT32_HELD): the sync
    sends it as float32 into a bf16 engine, the rest cast to bf16; verified in bytes, read back exactly (a bf16
    cast would round it), and in behaviour (the probe: the bf16 engine against the float32 trainer)."""
    from labkit.sync.spec import checked_expected

    with started_engine(moe_dir, dtype="bfloat16") as bf16:
        held = {n: d for n, (_, d) in checked_expected(bf16, ())["tensors"].items()}
        bias = sorted(n for n in held if n.endswith("e_score_correction_bias"))
        assert bias and {held[n] for n in bias} == {"float32"} and held["model.embed_tokens.weight"] == "bfloat16"
        _train(moe_trainer, 1, seed=41)
        m = sync(moe_trainer, bf16, SyncConfig(transport="colocated", probe=8, bucket_mb=0.05, progress=False))
        assert m["sync/verified"] is True and m["sync/apply_path"] == "copy_plan", m
        assert m["sync/probe_kl"] <= 0.25 and m["sync/probe_tokens"] > 0, m  # the probe's limit for a bf16 engine
        want = dict(moe_trainer.export())[bias[0]]
        assert not torch.equal(want, want.to(torch.bfloat16).float())  # so the read-back below can tell
        assert torch.equal(bf16.get_weights_by_name(bias[0]), want)


@pytest.mark.parametrize("family", ["deepseek-v3"], indirect=True)
def test_mla_pair_split_over_two_calls_is_never_written_and_the_baseline_keeps_it_in_one(family, moe_trainer,
                                                                                         moe_engine):
    """The hazard the planner prevents, shown on the engine: SGLang's DeepSeek loader answers Success for q_a and
    kv_a sent in two calls and never writes fused_qkv_a_proj_with_mqa; the per-tensor baseline sends them in one."""
    fused = "model.layers.1.self_attn.fused_qkv_a_proj_with_mqa.weight"
    sync(moe_trainer, moe_engine, SyncConfig(progress=False))
    before = moe_engine.checksums()[fused]
    exported = dict(moe_trainer.export())
    a = "model.layers.1.self_attn"
    moe_engine.begin_weight_update()
    for name in (f"{a}.q_a_proj.weight", f"{a}.kv_a_proj_with_mqa.weight"):
        moe_engine.update_weights_from_tensor([(name, torch.zeros_like(exported[name]))])  # raises on a refusal
    moe_engine.end_weight_update()
    assert moe_engine.checksums()[fused] == before  # both calls "succeeded"; nothing was written
    _train(moe_trainer, 1, seed=5)
    m = sync(moe_trainer, moe_engine, SyncConfig(transport="per-tensor", progress=False))
    assert m["sync/verified"] is True and moe_engine.checksums()[fused] != before


LAYOUTS = {"ep1": ParallelSpec(), "ep2": ParallelSpec(ep=2), "pp2": ParallelSpec(pp=2)}
# Each family against one rank in one layout (a trainer start each, ~35 s on 2 cores): DeepSeek-V3 at EP=2, whose
# export (MLA's fused pair, experts gathered across the EP group) is synced; Qwen3-MoE at PP=2.
PER_FAMILY = {"deepseek-v3": ("ep1", "ep2"), "qwen3-moe": ("ep1", "pp2")}


@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v3"], indirect=True)
def test_expert_and_pipeline_parallel_train_like_one_rank_and_their_export_syncs(family, moe_dir, moe_engine,
                                                                                tp2_engine):
    """EP=2 (each of two ranks holds half of every layer's experts) and PP=2: losses and the trained export equal
    one rank's; the EP=2 export (experts gathered across the EP group by mbridge) lands in the engine bitwise, and
    each layout's lands in the TP 2 engine, every rank verified."""
    from labkit.trainer.group import Trainer

    runs = {}
    for name in PER_FAMILY[family]:
        layout = LAYOUTS[name]
        t = Trainer(str(moe_dir), layout, TrainConfig(lr=3e-3))
        try:
            runs[name] = (_train(t, 3, seed=21), dict(t.export()))
            for engine in {"ep1": [], "ep2": [moe_engine, tp2_engine], "pp2": [tp2_engine]}[name]:
                m = sync(t, engine, SyncConfig(transport="colocated", bucket_mb=0.05, progress=False))
                assert m["sync/verified"] is True and m["sync/num_unverified"] == 0, (name, engine.tp_size, m)
                assert _greedy_follows(engine, t), (name, engine.tp_size)
        finally:
            t.shutdown()
    loss1, w1 = runs["ep1"]
    for name in PER_FAMILY[family][1:]:
        loss, w = runs[name]
        assert max(abs(a - b) for a, b in zip(loss1, loss)) <= 1e-5, (name, loss1, loss)
        assert w1.keys() == w.keys() and max((w1[n] - w[n]).abs().max().item() for n in w1) <= 1e-5, name
    with pytest.raises(ValueError, match=r"ep=3 is invalid: it must divide the routed experts \(8\)"):
        Trainer(str(moe_dir), ParallelSpec(ep=3))
    if not torch.cuda.is_available():  # MoE with TP needs sequence parallelism, which the CPU LayerNorm refuses
        with pytest.raises(ValueError, match=r"^tp=2 is invalid for an MoE model on CPU trainer ranks"):
            Trainer(str(moe_dir), ParallelSpec(tp=2))
