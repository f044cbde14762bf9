"""`labkit bench device`, stage 5: labkit's Megatron-core trainer rank without Ray, its export fed through the
colocated data path of stage 2 (labkit.lab.device.sync) into the engine stand-in, verified.

On the GPU machine megatron-core and mbridge travel as wheels (pure Python but for one helper that links no
torch); there is no Transformer Engine, so labkit picks Megatron's local layer spec (labkit.trainer.bridge).
"""

from __future__ import annotations

import torch

from labkit.sync.plan import TensorMeta
from labkit.sync.bucket import dtype_name
from labkit.lab.device import sync as ds


def megatron_stage(run, dev: str) -> None:
    from labkit.config import ParallelSpec, TrainConfig
    from labkit.models.hf import ReferenceModel
    from labkit.models.tiny import default_model_dir
    from labkit.trainer.rank import TrainerRank

    model_dir = default_model_dir()
    rank = TrainerRank(parallel=ParallelSpec(), train=TrainConfig())
    host, port = rank.address()
    run.m["device/megatron/compat"] = rank.setup(0, 1, host, port)
    loaded = rank.load(model_dir)
    tokens = torch.randint(4, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    mine = rank.forward(tokens)["logits"].float().cpu()
    ref = ReferenceModel(model_dir).forward(tokens)["logits"]
    mine = mine[..., : ref.shape[-1]]
    diff = (mine - ref).abs().max().item()
    step = rank.train_step(tokens, torch.ones_like(tokens)) or {}
    named = rank.export(to_cpu=False)
    run.m.update({"device/megatron/params": loaded["params"], "device/megatron/logits_max_diff": round(diff, 5),
                  "device/megatron/logits_ok": diff <= 5e-2,
                  "device/megatron/logits_ref_max_abs": round(ref.abs().max().item(), 3),
                  "device/megatron/logits_mean_abs_diff": round((mine - ref).abs().mean().item(), 5),
                  "device/megatron/argmax_agree": round((mine.argmax(-1) == ref.argmax(-1)).float().mean().item(), 4),
                  "device/megatron/train_loss": {k: float(v) for k, v in step.items() if isinstance(v, (int, float))},
                  "device/megatron/export_tensors": len(named),
                  "device/megatron/export_device": str(named[0][1].device)})
    run.m["device/megatron_export_ok"] = _sync_export(run, named, dev)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _sync_export(run, named: list[tuple[str, torch.Tensor]], dev: str) -> bool:
    """The export, bucketed and synced into a fresh engine stand-in, then verified."""
    src = {n: t.contiguous() for n, t in named}
    metas = tuple(TensorMeta(n, tuple(t.shape), dtype_name(t.dtype)) for n, t in src.items())
    engine = ds.EngineProc(dev)
    try:
        engine.call("build", [(t.name, t.shape, t.dtype) for t in metas])
        side = ds.TrainerSide(metas, 8 << 20, dev, engine, "xxh3_64" if dev == "cuda" else "device")
        try:
            r = side.sync(src)
            v = side.verify(src)
        finally:
            side.close()
    finally:
        engine.close()
    run.m["device/megatron/sync_seconds"] = round(r["seconds"], 4)
    run.m["device/megatron/sync_verified"] = v["sync/verified"]
    return bool(v["sync/verified"])
