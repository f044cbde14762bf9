"""The sync roofline: what a trainer -> engine weight sync would cost on GPUs, from bytes and spec sheets.

Pure (stdlib, plus labkit's torch-free planner and model enumerator): nothing here needs a GPU or a download.
For a model's tensor list (labkit.lab.roofline.tensors: any shipped name or config.json) and a hardware profile
it gives, per transport, the lower bound set by the one link every byte must cross, and a predicted time that
adds per-bucket and per-tensor overheads. The bounds:

- colocated (CUDA IPC): no wire; each GPU copies what it holds from the trainer's buffer into the engine's
  parameters, one HBM -> HBM copy that reads and writes every byte: 2 x bytes per GPU / HBM bandwidth;
- nvlink-broadcast (one node): every receiver takes in every byte once: bytes / NVLink per direction;
- rdma-broadcast (across nodes): every receiving node takes in every byte through the NICs the broadcast is
  striped over (1: the single-NIC funnel of a rank-0 broadcast), and each GPU still needs them over NVLink;
- rdma-p2p (all ranks, shard to shard): one copy per engine replica over min(sum of sender NICs, sum of
  receiver NICs).

Overheads default to labkit's own measurements on a 2-core CPU box (`cpu_overheads`, fitted from
data/bench_sync_cpu.json and notebook 04's bench curve, the arithmetic in `Overheads.derivation`): CPU-measured,
not GPU numbers. They are parameters: plug in a GPU's (the slime blog cited in labkit.lab.roofline.published
breaks a flattened bucket's cost on GPUs down into IPC open, rebuild and load).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from labkit.config import check, check_choice
# count_buckets, cpu_overheads and fit_overheads are re-exported: the roofline's callers need one module.
from labkit.lab.roofline.tensors import ModelTensors, Weights, count_buckets, load_config, model_tensors  # noqa: F401
from labkit.lab.roofline.overheads import (  # noqa: F401
    Overheads, cpu_overheads, cpu_overheads_repeats, cpu_residuals, fit_overheads, fit_residuals, gpu_hash_gbps)

GB, MB = 1e9, 1 << 20
ROOT = Path(__file__).resolve().parents[3]
HardwareName = Literal["H100", "H200", "H20"]
# How a sync's bytes cross, as the roofline bounds it (its own vocabulary: not SyncConfig.transport's names)
Link = Literal["colocated", "nvlink-broadcast", "rdma-broadcast", "rdma-p2p"]
CopyPerGpu = Literal["shard", "full"]
LINKS = get_args(Link)
_NIC = "ConnectX-7 NDR: 400 Gb/s = 50 GB/s per NIC, one per GPU (8 per HGX node, the NVIDIA reference design)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """One GPU type and its node. GB/s are 1e9 bytes per second, per direction where a link has two."""

    name: str
    """The profile's name (H100, H200, H20)."""
    hbm_gb: float
    """HBM capacity, GB (sizes the reference layout)."""
    hbm_gbps: float
    """HBM bandwidth (spec sheet). A device copy reads and writes each byte, so it runs at half of it."""
    nvlink_gbps: float
    """NVLink per direction per GPU (NVLink 4: 900 GB/s bidirectional = 450 each way)."""
    pcie_gbps: float
    """PCIe Gen5 x16 per direction (128 GB/s bidirectional); host-held weights (H2D) come through it."""
    nic_gbps: float
    """One RDMA NIC's line rate."""
    nics_per_node: int = 8
    """RDMA NICs per node."""
    gpus_per_node: int = 8
    """GPUs per node."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        for f in ("hbm_gb", "hbm_gbps", "nvlink_gbps", "pcie_gbps", "nic_gbps"):
            v = getattr(self, f)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f, v, "a positive GB/s")
        for f in ("nics_per_node", "gpus_per_node"):
            v = getattr(self, f)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f, v, "an integer >= 1")

    @property
    def nic_per_gpu_gbps(self) -> float:
        return self.nics_per_node * self.nic_gbps / self.gpus_per_node


HARDWARE: dict[str, Hardware] = {
    "H100": Hardware(name="H100", hbm_gb=80, hbm_gbps=3350, nvlink_gbps=450, pcie_gbps=64, nic_gbps=50, source=(
        "H100 SXM5: 80 GB HBM3 3.35 TB/s, NVLink 4 900 GB/s, PCIe Gen5 128 GB/s (NVIDIA H100 datasheet; "
        "glennklockwood.com/garden/processors/h100); " + _NIC)),
    "H200": Hardware(name="H200", hbm_gb=141, hbm_gbps=4800, nvlink_gbps=450, pcie_gbps=64, nic_gbps=50, source=(
        "H200 SXM: 141 GB HBM3e 4.8 TB/s, NVLink 4 900 GB/s, PCIe Gen5 128 GB/s (NVIDIA H200 product page); " + _NIC)),
    "H20": Hardware(name="H20", hbm_gb=96, hbm_gbps=4000, nvlink_gbps=450, pcie_gbps=64, nic_gbps=50, source=(
        "H20: 96 GB HBM3 4.0 TB/s, NVLink 4 900 GB/s, PCIe Gen5 (no public NVIDIA datasheet; as widely reported, "
        "e.g. willitrunai.com/gpus/h20-96gb); node NICs not published, assumed as HGX: " + _NIC)),
}


def hardware(name: str) -> Hardware:
    """The profile called `name`; a ValueError naming it and the known ones."""
    check(name in HARDWARE, "hardware", name, "one of " + ", ".join(HARDWARE))
    return HARDWARE[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Where trainer and engine sit: how many GPUs send, how many receive, how the engine is cut."""

    trainer_gpus: int = 8
    """GPUs that hold the trainer's weights (the senders)."""
    engine_gpus: int = 8
    """GPUs of every engine replica together (the receivers)."""
    engine_tp: int = 8
    """GPUs per engine replica (its TP x EP): a replica holds one full copy spread over them."""
    colocated_copy: CopyPerGpu = "shard"
    """Colocated: each GPU copies its shard (bytes / engine_tp: the least a colocated sync can copy) or the full
    model (an engine rank that reads every tensor whole)."""
    broadcast_nics: int = 1
    """NICs per node an inter-node broadcast is striped over (1: the single-NIC funnel)."""

    def __post_init__(self) -> None:
        for f in ("trainer_gpus", "engine_gpus", "engine_tp", "broadcast_nics"):
            v = getattr(self, f)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f, v, "an integer >= 1")
        check(self.engine_gpus % self.engine_tp == 0, "engine_tp", self.engine_tp,
              f"a divisor of engine_gpus={self.engine_gpus} (each replica is engine_tp GPUs)")
        check_choice(self, "colocated_copy")

    @property
    def replicas(self) -> int:
        return self.engine_gpus // self.engine_tp


TRAINER_BYTES_PER_PARAM = 16  # bf16 weights + fp32 master + two fp32 Adam moments (the trainer's state)


def reference_layout(mt: ModelTensors, hw: Hardware, fill: float = 0.8) -> Layout:
    """A colocated layout a team would plausibly run `mt` on: the fewest GPUs (a power of two, at least 8) whose
    HBM holds the trainer's state (16 bytes per parameter) in `fill` of it, an engine replica the fewest (at
    least 8) whose HBM holds the weights in half of it (the rest is KV cache). A reference, not a recipe."""

    def fewest(need: float) -> int:
        n = 8
        while n * hw.hbm_gb * GB < need:
            n *= 2
        return n

    tp = fewest(2 * mt.total_bytes)
    gpus = max(tp, fewest(TRAINER_BYTES_PER_PARAM * mt.params / fill))
    return Layout(trainer_gpus=gpus, engine_gpus=gpus, engine_tp=tp)


@dataclass(frozen=True, slots=True)
class Bound:
    """One transport's floor: seconds, the bytes over the limiting link, and the arithmetic in words."""

    transport: str
    seconds: float
    bytes: float
    formula: str


def _gb(x: float) -> str:
    return f"{x / GB:.4g}"


def fmt_seconds(x: float) -> str:
    """Milliseconds under a second (bounds are often ms), seconds above, 3 significant digits."""
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s" if x < 1000 else f"{x:,.0f} s"


def bound(transport: Link, model_bytes: float, hw: Hardware, layout: Layout = Layout()) -> Bound:
    """The time no sync over `transport` can beat for `model_bytes` (one full copy) on `hw` laid out as `layout`."""
    check(transport in LINKS, "transport", transport, "one of " + ", ".join(LINKS))
    m = float(model_bytes)
    if transport == "colocated":
        per_gpu = m / layout.engine_tp if layout.colocated_copy == "shard" else m
        return Bound(transport, 2 * per_gpu / (hw.hbm_gbps * GB), per_gpu,
                     f"2 x {_gb(per_gpu)} GB per GPU / {hw.hbm_gbps:g} GB/s HBM (a copy reads and writes)")
    if transport == "nvlink-broadcast":
        return Bound(transport, m / (hw.nvlink_gbps * GB), m,
                     f"{_gb(m)} GB into every receiver / {hw.nvlink_gbps:g} GB/s NVLink per direction")
    if transport == "rdma-broadcast":
        nics = min(layout.broadcast_nics, hw.nics_per_node)
        rate = min(nics * hw.nic_gbps, hw.nvlink_gbps)
        return Bound(transport, m / (rate * GB), m, f"{_gb(m)} GB into every node / min({nics} NIC x "
                     f"{hw.nic_gbps:g} GB/s, {hw.nvlink_gbps:g} GB/s NVLink) = {rate:g} GB/s")
    delivered = m * layout.replicas
    send, recv = layout.trainer_gpus * hw.nic_per_gpu_gbps, layout.engine_gpus * hw.nic_per_gpu_gbps
    return Bound(transport, delivered / (min(send, recv) * GB), delivered,
                 f"{layout.replicas} cop{'y' if layout.replicas == 1 else 'ies'} x {_gb(m)} GB / min({send:g} "
                 f"GB/s from {layout.trainer_gpus} senders, {recv:g} GB/s into {layout.engine_gpus} receivers)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A what-if: this model, in these weights, on this hardware and layout, in buckets of this size."""

    model: str = "qwen3-30b-a3b"
    """A shipped name (labkit.lab.roofline.tensors.names()), a config.json path or a model directory."""
    weights: Weights = "bf16"
    """bf16, fp8 (block FP8 projections + scales, as FP8 rollouts receive them) or fp32."""
    mtp: bool = True
    """Count the model's MTP layers (the draft rides along in labkit's syncs)."""
    hardware: HardwareName = "H100"
    """The GPU profile."""
    layout: Layout = field(default_factory=Layout)
    """Senders, receivers and how the engine is cut."""
    bucket_mb: float = 512.0
    """Bucket size in MiB (slime's default; verl's is 2048)."""

    def __post_init__(self) -> None:
        load_config(self.model)  # a ValueError naming the model and what is known
        check_choice(self, "weights")
        check(isinstance(self.mtp, bool), "mtp", self.mtp, "True or False")
        check_choice(self, "hardware")
        check(isinstance(self.layout, Layout), "layout", self.layout, "a labkit.lab.roofline.bounds.Layout")
        check(isinstance(self.bucket_mb, (int, float)) and not isinstance(self.bucket_mb, bool)
              and self.bucket_mb > 0, "bucket_mb", self.bucket_mb, "a positive number of MiB")

    def tensors(self) -> ModelTensors:
        return model_tensors(self.model, self.weights, self.mtp)


def transport_rows(s: Scenario, over: Overheads, tensors: ModelTensors | None = None) -> list[dict]:
    """One row per transport: bound and predicted seconds for `s`, plus the per-tensor-call baseline."""
    mt, hw = tensors or s.tensors(), hardware(s.hardware)
    nb = mt.buckets(int(s.bucket_mb * MB))
    rows = []
    for t in LINKS:
        b = bound(t, mt.total_bytes, hw, s.layout)
        extra = over.per_sync_s + nb * over.per_bucket_s + mt.num_tensors * over.per_tensor_s
        rows.append({"transport": t, "bytes": b.bytes, "bound_s": b.seconds, "formula": b.formula, "buckets": nb,
                     "tensors": mt.num_tensors, "overhead_s": extra, "predicted_s": b.seconds + extra})
    base = bound("colocated", mt.total_bytes, hw, s.layout)
    extra = mt.num_tensors * over.per_call_s
    rows.append({"transport": "per-tensor calls (colocated)", "bytes": base.bytes, "bound_s": base.seconds,
                 "formula": base.formula, "buckets": mt.num_tensors, "tensors": mt.num_tensors, "overhead_s": extra,
                 "predicted_s": base.seconds + extra})
    return rows


def whatif(s: Scenario, over: Overheads, sizes_bytes: list[int], tensors: ModelTensors | None = None) -> list[dict]:
    """Predicted seconds per transport at each bucket size (the bound does not move; the overheads do)."""
    mt = tensors or s.tensors()
    out = []
    for size in sizes_bytes:
        rows = transport_rows(replace(s, bucket_mb=size / MB), over, mt)
        out.append({"bucket_bytes": size, "buckets": rows[0]["buckets"],
                    **{r["transport"]: r["predicted_s"] for r in rows[:len(LINKS)]},
                    **{f"bound/{r['transport']}": r["bound_s"] for r in rows[:len(LINKS)]}})
    return out
