"""`labkit bench device`: labkit's colocated data path on one device, stage by stage, with torch alone.

Written for a GPU machine lent briefly, with torch but no SGLang, Ray or megatron-core (docs in
../shared/reference/feasibility_gpu_device.md); runs the same code on a CPU box in a small size (CI), so it
cannot rot. The engine is a STAND-IN (labkit.lab.device.engine): SGLang-shaped parameters behind labkit's
real loader; every output says so (`device/engine`). Stages, each written to `out` as it finishes, so a run cut
off by `deadline_s` still reports what it did:
1. `d2d`: a device-to-device copy (4 GiB on a GPU), the reference every rate is compared with;
2. per model (`models`: Qwen3-8B-shaped and the first 12 layers of Qwen3-30B-A3B, ~16 GB each in bf16; their
   small siblings on CPU), planned by labkit's planner into 512 MiB buckets: one cold sync, `warm` warm ones,
   each verified; a planted one-word flip that must fail verification; delta syncs at 1 % and 3 % changed
   words; the same syncs at a second bucket size (`heldout_mb`: the check of the refit below);
3. `hazard`: an engine that answers before its copies ran while the trainer reuses the buffer at once, with
   and without the wait labkit's loader does (`apply.settle`): parameters corrupted in each case;
4. `group`: a one-rank weight-update group (NCCL on a GPU, gloo on CPU): bind, broadcast, destroy;
5. `megatron` (device_megatron): labkit's TrainerRank without Ray on data/tiny-mimo, export fed through stage 2.
Then the roofline beside each measured time (labkit.lab.roofline.bounds: its bound and its prediction with the
CPU-measured overheads) and refit from this run (per bucket and per tensor, from the two models' syncs at the
main bucket size; checked against the held-out bucket size, which the fit never saw).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from labkit.lab.device import models as dm
from labkit.lab.device.sync import EngineProc, synchronize

STANDIN = ("stand-in: SGLang-shaped parameters (qkv_proj, gate_up_proj, w13_weight [E,2I,H], w2_weight [E,H,I]) "
           "behind labkit's LabkitWeights.param_view and labkit.engine.inside.apply in a spawned process; not SGLang")


class Run:
    """The results so far, written to `out` after every stage; the time left before `deadline_s`."""

    def __init__(self, out: str | None, deadline_s: float, command: str | None = None):
        self.m: dict = {}
        self.out, self.deadline, self.command = out, time.monotonic() + deadline_s, command

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def write(self) -> None:
        if self.out:
            record = {"command": self.command, **provenance(self.m), **self.m}
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out).write_text(json.dumps(record, indent=1, default=str))

    def stage(self, name: str, need_s: float, fn, *args) -> None:
        """Run `fn(self, *args)` if `need_s` seconds are left; record a failure as the stage's error."""
        if self.left() < need_s:
            self.m[f"device/{name}/skipped"] = f"deadline: {self.left():.0f} s left, {need_s:.0f} s needed"
        else:
            t0 = time.monotonic()
            try:
                fn(self, *args)
            except Exception as e:  # a stage's failure is a result; the next stages still run
                self.m[f"device/{name}/error"] = f"{type(e).__name__}: {e}"[:2000]
            self.m[f"device/{name}/stage_seconds"] = round(time.monotonic() - t0, 2)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # what the stage held goes back before the next one allocates
        self.write()


def bench_device(device: str = "auto", size: str = "auto", deadline_s: float = 330.0, warm: int = 5,
                 out: str | None = None, megatron: bool | None = None, bucket_mb: float | None = None,
                 command: str | None = None) -> dict:
    """Every stage that fits in `deadline_s`; the results (also written to `out` after each stage, led by
    `command`). `megatron` None: stage 5 on a GPU only. `bucket_mb`: the main bucket size (held out: half)."""
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dev not in ("cpu", "cuda") or (dev == "cuda" and not torch.cuda.is_available()):
        raise ValueError(f"bench device: device={device!r} is not available here: expected auto, cpu or cuda "
                         f"(CUDA {'present' if torch.cuda.is_available() else 'absent'})")
    size = ("full" if dev == "cuda" else "small") if size == "auto" else size
    if size not in dm.SIZES or warm < 1 or deadline_s <= 0:
        raise ValueError(f"bench device: size={size!r}, warm={warm}, deadline_s={deadline_s}: expected size one of "
                         f"auto, {', '.join(dm.SIZES)}; warm >= 1; a positive deadline")
    run = Run(out, deadline_s, command)
    run.m.update(header(dev, size))
    sz = dm.SIZES[size] if bucket_mb is None else dm.with_bucket(dm.SIZES[size], bucket_mb)
    run.stage("d2d", 5, d2d, dev, sz.d2d_bytes)
    run.stage("hash", 5, hash_check, dev, sz.d2d_bytes // 4)
    engine = EngineProc(dev)
    try:
        for i, (label, cfg) in enumerate(sz.models):
            run.stage(label, 30 if size == "full" else 5, dm.model_stage, engine, dev, label, cfg, sz, warm, i == 0)
    finally:
        engine.close()
    run.stage("group", 5, group, dev)
    dm.roofline(run.m, dev, size, sz)
    if megatron if megatron is not None else dev == "cuda":
        from labkit.lab.device.megatron import megatron_stage

        run.stage("megatron", 60, megatron_stage, dev)
    run.m["device/verified"] = verdict(run.m)
    run.m["device/seconds"] = round(deadline_s - run.left(), 1)
    run.write()
    return run.m


def header(dev: str, size: str) -> dict:
    name = torch.cuda.get_device_name() if dev == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    return {"device/name": name, "device/commit": commit(), "device/size": size, "device/torch": torch.__version__,
            "device/cuda": torch.version.cuda, "device/python": platform.python_version(),
            "device/host": platform.node(), "device/engine": STANDIN,
            "device/checksum": "labkit.engine.checksum.device_checksum on both sides (torch)"}


def provenance(m: dict) -> dict:
    """What made the run, at the top of the stored file: commit, host, versions (from the header's fields)."""
    from importlib import metadata

    versions = {"python": m.get("device/python"), "torch": m.get("device/torch"), "cuda": m.get("device/cuda")}
    for dist in ("megatron-core", "mbridge", "sglang"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    from labkit import provenance as prov

    return {"commit": m.get("device/commit"), "host": m.get("device/host"), "device": m.get("device/name"),
            "versions": versions, "provenance": prov.collect()}


def commit() -> str | None:
    """The code's commit (labkit.provenance: git's, or the manifest's where the tree travelled without its .git)."""
    from labkit import provenance as prov

    return prov.code_state()["commit"]


def d2d(run: Run, dev: str, nbytes: int) -> None:
    """A device copy of `nbytes`, median of 10 after a warm-up (CUDA events on a GPU)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(7)
    dst = torch.empty_like(src)
    times = []
    for i in range(11):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    s = sorted(times[1:])[len(times[1:]) // 2]
    run.m.update({"device/d2d_bytes": nbytes, "device/d2d_seconds": round(s, 6),
                  "device/d2d_gbps": round(nbytes / s / 1e9, 1),  # as one copy: bytes copied per second
                  "device/d2d_rw_gbps": round(2 * nbytes / s / 1e9, 1),  # read + write
                  "device/d2d_ok": bool(torch.equal(src[-4096:], dst[-4096:]))})


def hash_check(run: Run, dev: str, nbytes: int) -> None:
    """labkit's device hash: the same value on the host and on this device for the same bytes (an odd length:
    the zero-padded tail too), and its rate here."""
    from labkit.engine import checksum as ck

    gen = torch.Generator().manual_seed(0)
    host = torch.randint(0, 256, (1_000_003,), dtype=torch.uint8, generator=gen)
    big = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(3)
    ck.device_checksum(big)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    ck.device_checksum(big)
    s = time.perf_counter() - t0
    run.m.update({"device/hash_host_equals_device": ck.device_checksum(host) == ck.device_checksum(host.to(dev)),
                  "device/hash_gbps": round(nbytes / s / 1e9, 1)})


def group(run: Run, dev: str) -> None:
    """Rank 0 of a one-rank weight-update group, as the distributed transport builds it (NCCL needs one GPU per
    rank: two ranks on one GPU are refused by NCCL itself, "Duplicate GPU detected", so one rank is all a
    one-GPU machine can show)."""
    import torch.distributed as dist

    from labkit.sync.transports.distributed import bind_store, join_group

    backend = "nccl" if dev == "cuda" else "gloo"
    store, port, _ = bind_store("127.0.0.1", 1, 60.0)
    pg = join_group(store, 1, "labkit-device-check", backend, 60.0)
    t = torch.arange(1 << 20, dtype=torch.float32, device=dev)
    dist.broadcast(t, src=0, group=pg)
    synchronize(dev)
    ok = bool(torch.equal(t, torch.arange(1 << 20, dtype=torch.float32, device=dev)))
    dist.destroy_process_group(pg)
    run.m.update({"device/group_backend": backend, "device/group_ok": ok,
                  "device/nccl_ok": ok if backend == "nccl" else None,
                  "device/group_note": "one rank: NCCL refuses two ranks on one GPU (NVIDIA/nccl#103)"})


def verdict(m: dict) -> bool:
    """Every check the run reached held: each model verified every sync, caught the flip, verified the deltas;
    the loader's wait left no parameter corrupted; the group broadcast. A stage that failed fails the run."""
    checks = [v for k, v in m.items() if k.endswith(("/verified", "/flip_caught", "/delta_verified",
                                                      "/ipc_opened_once", "/group_ok", "/d2d_ok",
                                                      "/hash_host_equals_device"))]
    settled = m.get("device/hazard_params_corrupted", {}).get("sync_before_ack")
    errors = [k for k in m if k.endswith("/error") and not k.startswith("device/megatron/")]  # reported apart
    return bool(checks) and all(v is True for v in checks) and settled in (0, None) and not errors
