"""`labkit bench device`, stage 2: the two models it syncs, what it measures per model, and the roofline beside.

Two models of about the same bytes and 12x apart in tensor count (the field's MoE wall: per-tensor costs that
a dense model never shows), from labkit's real configs (labkit.models.real) through its own tensor
enumerator, so the planner cuts them exactly as it would the real checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from labkit.sync.delta import DeltaState
from labkit.models.real import QWEN3_30B_A3B
from labkit.lab.roofline.tensors import model_tensors
from labkit.lab.device import sync as ds

QWEN3_8B = {  # Qwen/Qwen3-8B config.json's shape fields (36 layers, GQA 32/8, untied head)
    "_name": "Qwen3-8B", "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "attention_bias": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16"}
QWEN3_30B_A3B_12L = {**QWEN3_30B_A3B, "_name": "Qwen3-30B-A3B (first 12 layers)", "num_hidden_layers": 12}
SMALL_DENSE = {**QWEN3_8B, "_name": "Qwen3-8B-shaped, small", "vocab_size": 4096, "hidden_size": 256,
               "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64}
SMALL_MOE = {**QWEN3_30B_A3B, "_name": "Qwen3-30B-A3B-shaped, small", "vocab_size": 4096, "hidden_size": 128,
             "intermediate_size": 384, "moe_intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 32}


@dataclass(frozen=True)
class Size:
    models: tuple[tuple[str, dict], ...]
    bucket_mb: float
    heldout_mb: float
    d2d_bytes: int


# The held-out size keeps every fused group whole (Qwen3-8B's gate_up is 201 MB: at 128 MiB each layer's would
# travel alone in a fresh buffer), so it moves the bucket count and nothing else.
SIZES = {"full": Size((("qwen3-8b", QWEN3_8B), ("qwen3-30b-a3b-12l", QWEN3_30B_A3B_12L)), 512, 256, 4 << 30),
         "small": Size((("qwen3-8b", SMALL_DENSE), ("qwen3-30b-a3b-12l", SMALL_MOE)), 1, 2, 64 << 20)}
FRACTIONS = (0.01, 0.03)


def with_bucket(size: Size, bucket_mb: float) -> Size:
    """`size` at another bucket size; the held-out size half of it."""
    return replace(size, bucket_mb=bucket_mb, heldout_mb=bucket_mb / 2)


def model_stage(run, engine: ds.EngineProc, dev: str, label: str, cfg: dict, size: Size, warm: int,
                hazard: bool) -> None:
    """Build the engine's parameters, then cold + warm syncs, the flip, deltas, the held-out bucket size and (for
    the first model) the hazard probe; frees both sides' memory after."""
    mt = model_tensors(cfg, "bf16", mtp=False)
    p = f"device/{label}"
    build_s, engine_bytes = engine.call("build", [(t.name, t.shape, t.dtype) for t in mt.tensors])
    run.m.update({f"{p}/model": mt.label, f"{p}/tensors": mt.num_tensors, f"{p}/bytes": mt.total_bytes,
                  f"{p}/engine_bytes": engine_bytes, f"{p}/engine_build_seconds": round(build_s, 3)})
    src = ds.source(mt.tensors, dev)
    algo = "xxh3_64" if dev == "cuda" else "device"  # labkit's checker; on CPU its device hash, forced
    side = ds.TrainerSide(mt.tensors, int(size.bucket_mb * (1 << 20)), dev, engine, algo)
    try:
        syncs(run, p, side, src, warm, mt.total_bytes)
        syncs(run, f"{p}/serial", side, src, 2, mt.total_bytes, start=50, overlap=False)
        run.write()
        flip(run, p, side, src, engine)
        deltas(run, p, side, src)
        run.write()
        held = ds.TrainerSide(mt.tensors, int(size.heldout_mb * (1 << 20)), dev, engine, algo)
        try:
            syncs(run, f"{p}/heldout", held, src, 2, mt.total_bytes, start=100)
            syncs(run, f"{p}/heldout/serial", held, src, 2, mt.total_bytes, start=150, overlap=False)
        finally:
            held.close()
        if hazard:
            hazard_probe(run, side.plan, src, dev, engine, algo, mt.tensors)
    finally:
        side.close()
        del src
        engine.call("free")
        if dev == "cuda":
            torch.cuda.empty_cache()


def syncs(run, p: str, side: ds.TrainerSide, src: dict, warm: int, nbytes: int, start: int = 0,
          overlap: bool = True) -> None:
    """A cold sync (the first of this plan; a warm one where the plan already ran) and `warm` more, each
    verified. `overlap` off: the trainer packs only once the engine answered (no two processes' copies at once)."""
    rs, vs = [], []
    for i in range(1 + warm):
        ds.bump(src, start + i)
        rs.append(side.sync(src, overlap=overlap))
        vs.append(side.verify(src))
        if run.left() < 20 and i >= 1:
            break
    w = rs[1:]
    sec = ds.median([r["seconds"] for r in w])
    cold_ptrs = set(rs[0]["ptrs"])
    d2d = run.m.get("device/d2d_gbps")
    run.m.update({
        f"{p}/buckets": len(side.plan.buckets), f"{p}/bucket_bytes": side.plan.bucket_bytes,
        f"{p}/warm_syncs": len(w), f"{p}/cold_sync_seconds": round(rs[0]["seconds"], 4),
        f"{p}/sync_seconds": round(sec, 4), f"{p}/sync_gbps": ds.gbps(nbytes, sec),
        f"{p}/pack_gbps": ds.gbps(nbytes, ds.median([r["pack"] for r in w])),
        f"{p}/apply_gbps": ds.gbps(nbytes, ds.median([r["apply"] for r in w])),
        f"{p}/host_ms": {k: round(ds.median([r[k] for r in w]) * 1e3, 2) for k in ("pack_host", "apply_host")},
        f"{p}/vs_d2d": round(nbytes / sec / 1e9 / d2d, 3) if d2d else None,
        f"{p}/deserialize_ms_per_bucket": {"cold": round(rs[0]["deserialize"] / len(side.plan.buckets) * 1e3, 3),
                                           "warm": round(ds.median([r["deserialize"] for r in w])
                                                         / len(side.plan.buckets) * 1e3, 3)},
        f"{p}/ipc_opened_once": all(set(r["ptrs"]) <= cold_ptrs for r in w) and len(cold_ptrs) <= 2,
        f"{p}/apply_path": rs[-1]["apply_path"],  # [tensors by copy plan, through load_weights] in the last sync
        f"{p}/verified": all(v["sync/verified"] for v in vs),
        f"{p}/verify_seconds": {"trainer": round(ds.median([v["trainer_hash_s"] for v in vs]), 4),
                                "engine": round(ds.median([v["engine_hash_s"] for v in vs]), 4)},
    })
    if not run.m[f"{p}/verified"]:
        run.m[f"{p}/mismatched"] = next(v["verify/mismatched"] for v in vs if not v["sync/verified"])


def flip(run, p: str, side: ds.TrainerSide, src: dict, engine: ds.EngineProc) -> None:
    """One bit of one engine parameter flipped after a verified sync: verification must fail, naming it."""
    names = sorted(side.expected(src))  # a hash pass over the whole model: once
    name = names[len(names) // 2]
    engine.call("flip", name)
    v = side.verify(src)
    engine.call("flip", name)
    run.m[f"{p}/flip_caught"] = (not v["sync/verified"]) and v["verify/mismatched"] == [name]
    run.m[f"{p}/flip_param"] = name


def deltas(run, p: str, side: ds.TrainerSide, src: dict) -> None:
    """An anchor sync (every byte, and the trainer's copy of it), then syncs of only the changed words."""
    state = DeltaState(anchor_every=1000, device=side.device)
    try:
        state.begin(side.plan, None)
        side.sync(src, state)
        ok = side.verify(src)["sync/verified"]
        state.commit("anchor")
        for i, f in enumerate(FRACTIONS):
            ds.change(src, f, seed=i + 1)
            state.begin(side.plan, "anchor" if i == 0 else f"d{i}")
            r = side.sync(src, state)
            v = side.verify(src)
            state.commit(f"d{i + 1}")
            m = state.metrics()
            run.m[f"{p}/delta_{f:g}"] = {"kind": m["sync/delta"], "changed_fraction": m["sync/changed_fraction"],
                                         "wire_bytes": m["sync/wire_bytes"], "seconds": round(r["seconds"], 4),
                                         "verified": v["sync/verified"]}
            ok = ok and v["sync/verified"] and m["sync/delta"] == "delta"
        run.m[f"{p}/delta_verified"] = ok
    finally:
        state.close()


def hazard_probe(run, plan, src: dict, dev: str, engine: ds.EngineProc, algo: str, tensors) -> None:
    """An engine that answers before its copies ran, a trainer that packs the next bucket into the one buffer at
    once (a pool of one slot, as the delta payload's): parameters that end up wrong, with and without the wait."""
    side = ds.TrainerSide(tensors, plan.bucket_bytes, dev, engine, algo, slots=1)
    out = {}
    try:
        for i, (k, settle) in enumerate((("ack_before_copy", False), ("sync_before_ack", True))):
            engine.call("settle", settle)
            ds.bump(src, 200 + i)
            side.sync(src)
            out[k] = side.verify(src)["corrupted"]
    finally:
        engine.call("settle", True)
        side.close()
    run.m["device/hazard_params_corrupted"] = out


def roofline(m: dict, dev: str, size: str, sz: Size) -> None:
    """The roofline beside each measured sync (its bound and its prediction with CPU-measured overheads, on this
    GPU's profile), then overheads refit from this run and their prediction of the held-out bucket size."""
    from labkit.lab.device.refit import refit, roofline_rows

    labels = [label for label, _ in sz.models]
    if dev == "cuda" and size == "full":
        roofline_rows(m, dict(sz.models), sz.bucket_mb)
    refit(m, labels)
    refit(m, labels, "serial")
