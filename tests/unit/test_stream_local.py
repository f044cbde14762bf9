"""labkit.sync.stream's local producer: any input order reaches the Syncer with fused groups together (the plan's
buckets need it; a safetensors file lists names alphabetically, which splits q/k/v by o_proj)."""

import torch

from labkit.sync.producer import LocalProducer
from labkit.sync.plan import fused_group


class _Recorder:
    """A consumer (run + close) that records the order it is handed."""

    closed = False

    def close(self):
        self.closed = True

    def run(self, named_iter, engine, cfg, engine_spec=None, weight_version=None, exclude=()):
        self.names = [n for n, _ in named_iter]
        return {"exclude": exclude, "version": weight_version}


def test_local_producer_brings_fused_groups_together_in_first_seen_order():
    names = sorted(f"model.layers.0.{m}.{p}.weight" for m, ps in
                   (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj",
                                                                                       "down_proj"))) for p in ps)
    rec = _Recorder()
    m = LocalProducer((n, torch.zeros(1)) for n in names).export_to(rec, None, None, None, "v1", exclude=["x"])
    assert m == {"exclude": ("x",), "version": "v1"} and sorted(rec.names) == names
    assert rec.closed  # the driver keeps no consumer: its buffers are freed at once
    groups = [fused_group(n) for n in rec.names]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert len(runs) == len(set(groups)), rec.names  # each group is one contiguous run
    assert rec.names[0] == names[0]  # the first input name leads (stable)
    alphabetical = [fused_group(n) for n in names]
    assert len([g for i, g in enumerate(alphabetical) if i == 0 or alphabetical[i - 1] != g]) > len(set(groups))


def test_stream_refuses_delta_before_touching_the_engine():
    import pytest

    from labkit.sync import SyncConfig, stream

    with pytest.raises(ValueError, match=r"stream\(\): SyncConfig.delta=3 needs a copy .* use delta=0"):
        stream([], None, SyncConfig(delta=3))  # no engine needed: refused first


def test_every_producer_has_the_protocols_export_to_and_no_sync():
    """The trainer (without importing sync/), its ranks and the local producer implement
    labkit.sync.producer.Producer; `sync` names only what moves weights into an engine."""
    import inspect

    from labkit.sync.producer import LocalProducer, Producer
    from labkit.trainer.group import Trainer
    from labkit.trainer.rank import TrainerRank

    def params(f) -> list[str]:  # Ray adds `_ray_trace_ctx` to an actor class's methods once it made an actor of it
        return [p for p in inspect.signature(f).parameters if not p.startswith("_ray")]

    want = params(Producer.export_to)
    for cls in (Trainer, LocalProducer):
        assert params(cls.export_to) == want, cls
    assert params(TrainerRank.export_to) == want[:-1]  # the driver owns the deadline
    assert not any(hasattr(cls, "sync") for cls in (Trainer, TrainerRank, LocalProducer))
