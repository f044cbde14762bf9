"""Published weight-sync times beside their roofline: how close each system came to the limit of its transport.

Each row is a number a project published (its `source` names the PR, README or post, and the section of labkit's
reference notes, anchors_weight_sync.md or anchors_field_2026.md, that quotes it), the bytes it moved (bf16 or
FP8 as that system moved them, enumerated from the model's config by labkit.lab.roofline.tensors), the bound of
the transport it used on its hardware (labkit.lab.roofline.bounds.bound) and the fraction of its limit = bound /
published time (for a system that published a rate: rate / the link's rate). Where the publication leaves a
layout open, the row picks the assumption that makes the bound smallest (the most generous to the system) and
says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.config import check, check_choice
from labkit.lab.roofline.bounds import GB, MB, HardwareName, Layout, Link, Overheads, bound, fmt_seconds, hardware
from labkit.lab.roofline.tensors import Weights, model_tensors


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """One published sync, with what the roofline needs to place it."""

    system: str
    """Who published it, and where (PR, README, post)."""
    model: str | None
    """A shipped model name (labkit.lab.roofline.tensors.names()); None when the publication names no size."""
    model_text: str
    """The model as the publication names it."""
    hardware: HardwareName
    """The GPU profile the bound uses."""
    hardware_text: str
    """The hardware as published (or 'not stated')."""
    mode: str
    """How it moved the weights, in the publication's words."""
    transport: Link
    """The roofline transport that matches the mode."""
    layout: Layout = field(default_factory=Layout)
    """Senders, receivers, engine cut, NICs per broadcast."""
    weights: Weights = "bf16"
    """What crossed the wire."""
    bucket_mb: float | None = None
    """The published bucket size in MiB, where a colocated sync's prediction (bound + labkit's end-to-end
    overheads, `evaluate`) can be set beside the published time; None leaves the row without one."""
    published_s: float | None = None
    """The published seconds per sync (the latest, best number)."""
    published_text: str = ""
    """The published result as written (with the 'before' where there is one)."""
    rate_gbps: float | None = None
    """A published per-GPU rate (GB/s) instead of a time, compared with the per-GPU NIC rate."""
    assumption: str = ""
    """What the row assumes where the publication is silent."""
    source: str = ""
    """Where the number is published."""

    def __post_init__(self) -> None:
        check_choice(self, "hardware")
        check_choice(self, "transport")
        check_choice(self, "weights")
        check((self.published_s is None) != (self.rate_gbps is None), "published_s", self.published_s,
              "a time, or None with rate_gbps given (exactly one of them)")
        check(bool(self.source), "source", self.source, "the publication the number comes from")
        check(self.bucket_mb is None or (self.transport == "colocated" and isinstance(self.bucket_mb, (int, float))
                                         and not isinstance(self.bucket_mb, bool) and self.bucket_mb > 0),
              "bucket_mb", self.bucket_mb, "None, or a positive number of MiB on a colocated row (labkit's "
              "end-to-end costs are a colocated sync's)")


PUBLISHED: tuple[Published, ...] = (
    Published(system="verl PR #2418", model="moonlight-16b-a3b", model_text="Moonlight-16B-A3B", hardware="H20",
              hardware_text="8×H20", mode="colocated Megatron → SGLang, CUDA IPC, 512 MB buckets",
              transport="colocated", layout=Layout(trainer_gpus=8, engine_gpus=8, engine_tp=8), published_s=18.0,
              bucket_mb=512,
              published_text="175 s → 18 s",
              assumption="bf16; SGLang TP=8 over the 8 GPUs (not stated), so each GPU copies its 1/8 shard, the "
                         "least a colocated sync copies (a GPU copying the whole model: bound ×8); the trainer's "
                         "TP/EP gather is not in the bound",
              source="verl-project/verl PR #2418 (commit 1fe5daf7f), PR table row 'Moonlight16B @ 8xH20, 512MB, "
                     "175s -> 18s' (anchors_weight_sync.md §0.1 row 1)"),
    Published(system="slime (blog)", model="qwen3-30b-a3b", model_text="Qwen3-30B-A3B", hardware="H100",
              hardware_text="not stated (slime's Qwen3-30B-A3B example: 8×H100)",
              mode="colocated Megatron → SGLang, CUDA IPC, flattened 512 MB buckets", transport="colocated",
              layout=Layout(trainer_gpus=8, engine_gpus=8, engine_tp=8), published_s=7.0, bucket_mb=512,
              published_text="120 s → 90 → 30 → 7 s",
              assumption="bf16 on 8×H100 (slime's example; the post names no hardware); engine TP/EP=8, each GPU "
                         "copies its 1/8 shard; the trainer's gather is not in the bound",
              source="slime blog 'Efficient RL Training – Optimizing Weight Sync in slime' (hebiao064.github.io/"
                     "rl-weight-sync; hebiao064/hebiao064.github.io _posts/2025-08-27-rl-weight-sync.md) "
                     "(anchors_weight_sync.md §0.1 row 3)"),
    Published(system="checkpoint-engine", model="kimi-k2", model_text="Kimi-K2-Instruct (1T)", hardware="H20",
              hardware_text="256×H20 (16 × TP16)", mode="broadcast from CPU-held shards (H2D → NCCL broadcast → "
              "IPC reload), 8 GiB buckets", transport="rdma-broadcast", weights="fp8",
              layout=Layout(trainer_gpus=256, engine_gpus=256, engine_tp=16, broadcast_nics=8),
              published_s=16.04, published_text="16.04 s (v0.1.3: 21.50 s)",
              assumption="FP8 as served (e4m3 + block scales); a broadcast hands every node every byte, striped "
                         "over its 8 × 400G NICs (H20 node NICs not published; HGX: one per GPU). With one NIC per "
                         "node the bound would be 20.6 s, above 16.04 s: more than one NIC was used",
              source="MoonshotAI/checkpoint-engine README.md @ 59a3c4ff, broadcast table "
                     "(anchors_weight_sync.md §0.1 row 10, §4)"),
    Published(system="Perplexity", model="kimi-k2", model_text="Kimi-K2 (1T)", hardware="H100",
              hardware_text="256 training → 128 inference GPUs (type not stated)",
              mode="disaggregated, one-sided RDMA WRITE, static schedule", transport="rdma-p2p", weights="fp8",
              layout=Layout(trainer_gpus=256, engine_gpus=128, engine_tp=128), published_s=1.3,
              published_text="1.3 s (BF16 train → FP8 inference)",
              assumption="one 400G NIC per GPU (TransferEngine's 400 Gb/s on CX-7/EFA); one FP8 copy delivered in "
                         "all, the least any schedule writes (replicas not stated): k replicas need k copies, bound "
                         "×k (8 replicas of 16 GPUs: 1.29 s, 99 % of 1.3 s)",
              source="research.perplexity.ai 'Weight Transfer for RL Post-Training in under 2 seconds' "
                     "(2025-09-24); arXiv 2510.27656 (anchors_weight_sync.md §0.1 row 12)"),
    Published(system="prime-rl", model=None, model_text="GLM (size not stated)", hardware="H200",
              hardware_text="64 → 32 H200", mode="disaggregated, NIXL pull (RDMA), pipelined", transport="rdma-p2p",
              layout=Layout(trainer_gpus=64, engine_gpus=32, engine_tp=32), rate_gbps=44.3,
              published_text="2.84 s median; 44.3 GB/s per GPU",
              assumption="a rate per GPU as published (sender or receiver side not stated), compared with one "
                         "400G NIC per GPU (50 GB/s); bytes and model size not published",
              source="prime-rl, as summarised in anchors_field_2026.md (weight-sync table: 'GLM, 64→32 H200: "
                     "2.84 s median; 44.3 GB/s per GPU (~88 % of one 400G NIC)')"),
)


def evaluate(p: Published, over: Overheads | None = None, hash_gbps: float | None = None) -> dict:
    """The row as the table shows it: bytes moved, the transport's bound and the fraction of its limit; with
    `over` (overheads fitted end to end: a published time is what its users waited), a published bucket size and
    `hash_gbps` (the rate of labkit's checksum on a GPU), also the seconds labkit's default sync would take there,
    like with like: bound + two hash passes over each GPU's bytes (the trainer's and the engine's, which the
    end-to-end fit counted with the bytes) + over's per-sync, per-bucket and per-tensor costs."""
    hw = hardware(p.hardware)
    row = {"system": p.system, "model": p.model_text, "hardware": p.hardware_text, "mode": p.mode,
           "transport": p.transport, "published": p.published_text, "published_s": p.published_s,
           "weights": p.weights, "assumption": p.assumption, "source": p.source}
    if p.model is None:  # a published rate: compare with the per-GPU NIC rate
        nic = hw.nic_per_gpu_gbps
        return {**row, "bytes": None, "bound_s": None, "fraction_of_limit": p.rate_gbps / nic,
                "bound": f"{nic:g} GB/s per GPU (one NIC; NVLink's {hw.nvlink_gbps:g} GB/s would put it at "
                         f"{p.rate_gbps / hw.nvlink_gbps:.1%})"}
    mt = model_tensors(p.model, p.weights, mtp=False)
    b = bound(p.transport, mt.total_bytes, hw, p.layout)
    row = {**row, "bytes": mt.total_bytes, "params": mt.params, "tensors": mt.num_tensors, "bound_s": b.seconds,
           "bound": f"{fmt_seconds(b.seconds)}: {b.formula}", "fraction_of_limit": b.seconds / p.published_s}
    if over is not None and hash_gbps is not None and p.bucket_mb is not None:
        nb, hashing = mt.buckets(int(p.bucket_mb * MB)), 2 * b.bytes / (hash_gbps * GB)
        row.update(buckets=nb, hash_s=hashing, hash_gbps=hash_gbps, predicted_s=b.seconds + hashing
                   + over.per_sync_s + nb * over.per_bucket_s + mt.num_tensors * over.per_tensor_s)
    return row


def published_rows(over: Overheads | None = None, hash_gbps: float | None = None) -> list[dict]:
    return [evaluate(p, over, hash_gbps) for p in PUBLISHED]


def describe(row: dict) -> str:
    """One line for a row, for logs."""
    moved = "–" if row["bytes"] is None else f"{row['bytes'] / GB:.1f} GB {row['weights']}"
    return f"{row['system']}: {row['published']}, {moved}, bound {row['bound']}, {row['fraction_of_limit']:.2%}"
