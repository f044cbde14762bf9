"""`labkit bench codec`: the delta codec and the bucket pack alone on one device (a GPU where there is one).

A delta sync trades bytes on the wire for work at both ends (labkit.engine.inside.delta: compare a bucket with the copy
of what the engine holds and gather the changed words; scatter them into the engine's parameters). Whether the
trade pays depends on the link the bucket crosses. Through shared memory on the CPU box a full bucket moves at
copy speed and a delta sync is slower than a full one (`labkit bench delta`, data/bench_delta_cpu.json); across a
NIC a full bucket costs its bytes over the link's bandwidth. This bench times the codec's own code on synthetic
bf16 buckets at given changed fractions (1-3 %: verl PR #6974's range; 13 %: the CPU bench model after a 1e-5
step), beside a plain copy of the bucket (what the engine does with a full one), and derives the link speed
below which a delta bucket (encode + payload + decode) beats a full one (bucket + copy):
`break_even_gbps` = (bucket - payload) bytes / (encode + decode - copy) seconds.

It also packs a bucket of many small tensors (`bucket.pack`, fp32 sources cast to bf16: a trainer's master
weights into a bf16 engine's layout) to show what a tensor costs there, the per-tensor term of the roofline.

Every timing is the median of `reps` after one warm-up, with the device synchronised around it. Its own check
can fail: `bench/codec/verified` is true only if every decode reproduced the new bucket bitwise from the old
one, every encode left the copy equal to the new bucket, and every pack unpacks to its sources.
"""

from __future__ import annotations

import statistics
import time

import torch

from labkit.engine.inside import delta as codec
from labkit.sync import bucket as bk
from labkit.sync.plan import Bucket, TensorMeta

FRACTIONS = (0.01, 0.03, 0.13)
PACK_TENSOR_BYTES = 96 * 192 * 2  # one bf16 expert matrix of the qwen3-moe preset (hidden 192, expert width 96)


def bench_codec(device: str = "auto", bucket_mb: float = 32.0, fractions: tuple[float, ...] = FRACTIONS,
                reps: int = 5, tensors: int = 64, seed: int = 0) -> dict:
    """The codec at each changed fraction and one pack, on `device` ("auto": CUDA if present, else CPU)."""
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dev not in ("cpu", "cuda") or (dev == "cuda" and not torch.cuda.is_available()):
        raise ValueError(f"bench codec: device={device!r} is not available here: expected auto, cpu or cuda "
                         f"(CUDA {'present' if torch.cuda.is_available() else 'absent'})")
    if not 0 < bucket_mb or not all(0 < f < 1 for f in fractions) or reps < 1 or tensors < 1:
        raise ValueError(f"bench codec: bucket_mb={bucket_mb}, fractions={fractions}, reps={reps}, "
                         f"tensors={tensors}: expected a positive size, fractions in (0, 1), reps and tensors >= 1")
    gen = torch.Generator(device=dev).manual_seed(seed)
    n = int(bucket_mb * (1 << 20)) // 2 // tensors * tensors  # bf16 words, a whole number per tensor
    old = (torch.randn(n, generator=gen, device=dev) * 0.02).bfloat16()
    into = torch.empty_like(old)
    copy_s = _seconds(lambda: None, lambda: into.copy_(old), reps, dev)
    out = {"bench/codec/device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "bench/codec/torch": torch.__version__, "bench/codec/bucket_bytes": 2 * n,
           "bench/codec/tensors": tensors, "bench/codec/reps": reps,
           "bench/codec/copy_seconds": round(copy_s, 7), "bench/codec/copy_gbps": round(2 * n / copy_s / 1e9, 2)}
    ok = []
    for f in fractions:
        part, good = _one_fraction(old, f, gen, tensors, reps, copy_s)
        out.update({f"bench/codec/changed_{f:g}/{k}": v for k, v in part.items()})
        ok.append(good)
    part, good = _pack(2 * n, dev, gen, reps)
    out.update({f"bench/pack/{k}": v for k, v in part.items()})
    out["bench/codec/verified"] = all(ok) and good
    return out


def _one_fraction(old: torch.Tensor, f: float, gen, tensors: int, reps: int, copy_s: float) -> tuple[dict, bool]:
    """Encode a bucket with a fraction `f` of its words changed against `old`, then decode it into a copy of
    `old` split into `tensors` destinations (as an engine's parameters are)."""
    n, dev = old.numel(), old.device.type
    new = old.clone()
    hit = torch.rand(n, generator=gen, device=old.device) < f
    new.view(torch.int16)[hit] += 1  # the next bf16 value up: a changed word, bitwise
    new8, shadow = new.view(torch.uint8), torch.empty_like(old).view(torch.uint8)
    buf = torch.empty(2 * n, dtype=torch.uint8, device=old.device)
    res = []
    enc_s = _seconds(lambda: shadow.copy_(old.view(torch.uint8)),
                     lambda: res.append(codec.encode(new8, shadow, 2, buf)), reps, dev)
    payload, k, encoding = res[-1]
    encoded_ok = torch.equal(shadow, new8)
    dst = torch.empty_like(old)
    size = n // tensors
    spans = [(2 * i * size, 2 * (i + 1) * size) for i in range(tensors)]
    dsts = [dst[i * size:(i + 1) * size] for i in range(tensors)]
    dec_s = _seconds(lambda: dst.copy_(old), lambda: codec.decode_into(payload, 2, n, spans, dsts, encoding),
                     reps, dev)
    decoded_ok = torch.equal(dst.view(torch.int16), new.view(torch.int16))
    saved, extra = 2 * n - payload.numel(), enc_s + dec_s - copy_s
    return {"changed_fraction": round(k / n, 6), "encoding": encoding, "payload_bytes": payload.numel(),
            "payload_ratio": round(payload.numel() / (2 * n), 4), "encode_seconds": round(enc_s, 7),
            "decode_seconds": round(dec_s, 7), "encode_gbps": round(2 * n / enc_s / 1e9, 2),
            "decode_gbps": round(2 * n / dec_s / 1e9, 2),
            # delta wins on links slower than this (None: it costs no more than the copy, it wins on any link)
            "break_even_gbps": round(saved / extra / 1e9, 2) if extra > 0 else None,
            "verified": bool(encoded_ok and decoded_ok)}, bool(encoded_ok and decoded_ok)


def _pack(nbytes: int, dev: str, gen, reps: int) -> tuple[dict, bool]:
    """Pack fp32 sources of one small size into a bf16 bucket of about `nbytes` (one cast-and-copy per run)."""
    count = max(1, nbytes // PACK_TENSOR_BYTES)
    shape = (96, 192)
    metas = tuple(TensorMeta(f"model.layers.0.mlp.experts.{i}.down_proj.weight", shape, "bfloat16")
                  for i in range(count))
    b = Bucket(0, metas)
    src = torch.randn(count, *shape, generator=gen, device=dev)
    tensors = {m.name: src[i] for i, m in enumerate(metas)}
    buf = torch.empty(b.nbytes, dtype=torch.uint8, device=dev)
    pack_s = _seconds(lambda: None, lambda: bk.pack(b, tensors, buf), reps, dev)
    ok = torch.equal(buf.view(torch.bfloat16).view(count, *shape), src.bfloat16())
    return {"tensors": count, "bytes": b.nbytes, "seconds": round(pack_s, 7),
            "gbps": round(b.nbytes / pack_s / 1e9, 2), "us_per_tensor": round(pack_s / count * 1e6, 3),
            "verified": bool(ok)}, bool(ok)


def _seconds(prep, fn, reps: int, dev: str) -> float:
    """Median seconds of `fn` over `reps` runs after one warm-up; `prep` runs before each, untimed."""
    times = []
    for _ in range(reps + 1):
        prep()
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])
