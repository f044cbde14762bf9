"""Trainer layouts into engines sharded differently: Megatron trainers at TP 1, TP 2 and PP 2 into SGLang's CPU engine
at TP 1 (the session's) and at TP 2 (labkit.compat.cpu_tp), over every transport that can reach it; each rank
verified against its own piece of the export (labkit.engine.shard), each rank's copy plan writing its piece (no
`load_weights` fallback), greedy output equal to the trainer's. The session's model (vocabulary 131, served padded
to 192 rows: 96 per rank). FFN widths a TP 2 engine pads, and K/V heads it replicates: test_families.py.
"""

import pytest
import torch

from labkit.config import ParallelSpec, TrainConfig
from labkit.engine import Unsupported
from labkit.models import tokenizer
from labkit.sync import SyncConfig, sync
from labkit.tasks import arith
from tests.integration.conftest import restore_model_dir, started_engine

pytestmark = pytest.mark.integration

# trainer layout -> (engine TP, transport) it syncs into: TP 1 over every transport into the TP 2 engine; TP 2 and
# PP 2 into both engines (the two commands: TP 2 over distributed, PP 2 over colocated)
LAYOUTS = {"tp1": (ParallelSpec(), [(2, "colocated"), (2, "per-tensor"), (2, "distributed")]),
           "tp2": (ParallelSpec(tp=2), [(1, "distributed"), (2, "distributed")]),
           "pp2": (ParallelSpec(pp=2), [(1, "colocated"), (2, "colocated")])}
L0 = "model.layers.0"


@pytest.fixture(scope="module")
def tp2_engine(engine_model_dir):
    with started_engine(engine_model_dir, tp=2) as handle:
        yield handle


def test_a_cpu_engine_at_tp2_answers_greedy_as_transformers_does(tp2_engine, engine_model_dir):
    """Two schedulers, each bound to a core of its own, their all-reduce over gloo: transformers' greedy tokens."""
    from labkit.models.hf import ReferenceModel

    trunk = ReferenceModel(engine_model_dir).trunk
    ids = [tokenizer.encode(p) for p in ("hello world", "1+2=", "The quick brown fox")]
    for i, o in zip(ids, tp2_engine.generate(input_ids=ids, sampling={"temperature": 0, "max_new_tokens": 8})):
        ref = trunk.generate(torch.tensor([i]), max_new_tokens=8, do_sample=False,
                             pad_token_id=tokenizer.PAD)[0, len(i):].tolist()
        assert o["tokens"] == ref[: ref.index(tokenizer.EOS) + 1] if tokenizer.EOS in ref else ref


def test_each_rank_holds_its_own_piece(tp2_engine):
    ck = tp2_engine.checksums()
    assert {k.rsplit("#tp", 1)[1] for k in ck} == {"0", "1"}
    o = f"{L0}.self_attn.o_proj.weight"
    assert ck[f"{o}#tp0"] != ck[f"{o}#tp1"]  # split: each rank a different half
    assert ck["model.norm.weight#tp0"] == ck["model.norm.weight#tp1"]  # replicated


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_trainer_layout_syncs_into_tp1_and_tp2_engines_bitwise_per_rank(layout, engine_model_dir, engine,
                                                                              tp2_engine):
    from labkit.trainer.group import Trainer

    parallel, targets = LAYOUTS[layout]
    t = Trainer(str(engine_model_dir), parallel, TrainConfig(lr=3e-3))
    try:
        for k, (tp, transport) in enumerate(targets):
            into = tp2_engine if tp == 2 else engine
            t.train_step(*arith.batch(arith.problems(16, seed=40 + k)))  # every sync lands new weights
            m = sync(t, into, SyncConfig(transport=transport, bucket_mb=0.05, progress=False))
            assert m["sync/verified"] is True and m["sync/num_unverified"] == 0, (layout, tp, transport, m)
            assert m["sync/engine_tp"] == tp and m["verify/num_checked"] == len(into.checksums()), m  # every rank's
            want = "load_weights" if transport == "per-tensor" else "copy_plan"
            assert m["sync/apply_path"] == want, (layout, tp, transport, m["sync/apply_path"])
            ids = [tokenizer.encode(p.prompt) for p in arith.problems(4, seed=78)]
            got = into.generate(input_ids=ids, sampling={"temperature": 0, "max_new_tokens": 6})
            assert [o["tokens"] for o in got] == t.greedy(ids, 6, eos_id=tokenizer.EOS), (layout, tp, transport)
        if layout == "tp1":
            with pytest.raises(Unsupported, match="verify='full'.*tp=2"):
                sync(t, tp2_engine, SyncConfig(verify="full", progress=False))
            with pytest.raises(Unsupported, match="delta=2.*tp=2"):
                sync(t, tp2_engine, SyncConfig(delta=2, progress=False))
    finally:
        t.shutdown()
        restore_model_dir(engine, engine_model_dir)  # the session's engine serves its model dir again
