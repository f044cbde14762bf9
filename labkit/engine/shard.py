"""Which slice of each HF tensor an engine rank holds at tensor parallelism tp > 1: written once, read by the
verifier (each rank's expected checksums, labkit.sync.verify) and by the engine's model code (each rank's copy
plan, labkit.engine.inside.sglang_models.weights.param_view).

SGLang 0.5.23's parallel layers (file:line in `sglang/srt/`; docs/resharding.md has the table):
- `ColumnParallelLinear` / `MergedColumnParallelLinear` / `QKVParallelLinear` (`layers/linear.py:395, 652,
  1075`): rows split, each fused part (q, k, v; gate, up) split on its own, so rank r's `qkv_proj` is
  `[q_r; k_r; v_r]`. K/V heads fewer than tp are replicated: rank r holds head `r // (tp // kv_heads)`
  (`num_kv_head_replicas`, `:1142`; on a GPU: a CPU engine pads them instead, refused here).
- `RowParallelLinear` (`:1553`): columns split (`o_proj`, `down_proj`).
- `FusedMoE` without expert parallelism (`layers/moe/fused_moe_triton/layer.py:390-428`): every expert on every
  rank, its intermediate dim split (`w13_weight` rows of gate and up, `w2_weight` columns).
- `VocabParallelEmbedding` / `ParallelLMHead` (`layers/vocab_parallel_embedding.py:188, 546`): rows of the padded
  table split.
- replicated: norms, MoE routers and their bias, MLA's `q_a_proj`/`kv_a_proj_with_mqa`, labkit's MTP draft
  store (`model.mtp_layers.*`, labkit.engine.inside.sglang_models.mimo).
A CPU engine pads FFN widths to 32 * tp and vocabulary tables to 64 (or 64 * tp) first
(labkit.engine.contract.engine_shape); the split is of the padded tensor, so a rank may hold only padding.

Heads that tp does not divide are padded by a CPU engine (`adjust_config_with_unaligned_cpu_tp`,
`configs/update_config.py:226`) and refused here, naming the field, as is any name no rule covers: a guessed
slice would be a verification that passes or fails for the wrong reason.

Pure Python, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.engine.errors import EngineError, Unsupported

Piece = tuple[int, int, int]  # (dim, start, length) of the engine-shaped (padded) HF tensor

_REPLICATED = re.compile(r"(norm\.(weight|bias)$|\.mlp\.gate\.weight$|\.e_score_correction_bias$|"
                         r"\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight$|^model\.mtp_layers\.)")
_ROWS = re.compile(r"\.(q_proj|gate_proj|up_proj|q_b_proj|kv_b_proj)\.(weight|bias)$")
_KV = re.compile(r"\.self_attn\.(k_proj|v_proj)\.(weight|bias)$")
_COLS = re.compile(r"\.(o_proj|down_proj)\.weight$")
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")
RANK_SEP = "#tp"


def rank_key(name: str, rank: int, tp: int) -> str:
    """How a checksum of engine parameter `name` on TP rank `rank` is keyed: the name itself at tp 1, else
    `name#tp<rank>`, so one flat dict holds every rank's and a mismatch names its rank."""
    return name if tp == 1 else f"{name}{RANK_SEP}{rank}"


def rank_checksums(ranks: list[dict]) -> dict[str, str]:
    """SGLang's `check_weights("checksum")` reply (one entry per rank: its checksums and `parallelism_info`, a
    list of the roles that rank runs) as one dict keyed by `rank_key`. The target model's ranks only (a
    speculative draft reports roles of its own); a data- or pipeline-parallel engine is refused: labkit says what
    each TP rank holds, not more."""
    infos = [_target_info(r.get("parallelism_info")) for r in ranks]
    target = [(r, i) for r, i in zip(ranks, infos) if i is not None]
    if not target:
        raise Unsupported(f"checksums: the engine reported no target-model rank ({len(ranks)} entries)")
    for _, i in target:
        if i.get("dp_size", 1) != 1 or i.get("pp_size", 1) != 1:
            raise Unsupported(f"checksums: an engine at dp_size={i.get('dp_size')} pp_size={i.get('pp_size')}; "
                              "labkit verifies engines sharded by TP only")
    tp = int(target[0][1].get("tp_size", 1))
    if sorted(int(i.get("tp_rank", 0)) for _, i in target) != list(range(tp)):
        raise EngineError(f"checksums: the engine reported ranks {[i.get('tp_rank') for _, i in target]} of tp={tp}")
    return {rank_key(n, int(i.get("tp_rank", 0)), tp): c for r, i in target for n, c in r["checksums"].items()}


def _target_info(info) -> dict | None:
    """The target model's parallelism info in a rank's `parallelism_info` (a dict, or a list of one per role;
    none given: a lone rank)."""
    for i in info if isinstance(info, list) else [info or {"role": "target"}]:
        if i.get("role", "target") == "target":
            return i
    return None


@dataclass(frozen=True)
class Sharding:
    """An engine's tensor parallelism, and the head counts its K/V split depends on.

    `tp`: the engine's TP size. `heads` / `kv_heads`: the model's attention and K/V heads (config.json's
    num_attention_heads / num_key_value_heads; kv_heads None: every head has its own, as in MLA). `device`: the
    engine's ("cpu": SGLang pads K/V heads fewer than tp there instead of replicating them)."""
    tp: int = 1
    heads: int | None = None
    kv_heads: int | None = None
    device: str = "cpu"

    def __post_init__(self):
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"Sharding.tp={self.tp!r}: must be a positive int")
        if self.tp == 1:
            return
        if self.heads is not None and self.heads % self.tp:
            raise Unsupported(f"num_attention_heads={self.heads} is not a multiple of the engine's tp={self.tp}: "
                              "SGLang pads the heads on CPU, and labkit does not yet verify or copy into padded "
                              "heads; use an engine tp that divides the heads")
        kv = self.kv_heads
        if kv is not None and self.device == "cpu" and kv % self.tp:
            raise Unsupported(f"num_key_value_heads={kv} is not a multiple of the engine's tp={self.tp}: SGLang's "
                              "CPU engine pads the K/V heads (and the heads with them) rather than replicate them "
                              "(`adjust_config_with_unaligned_cpu_tp`), which labkit does not yet verify or copy into")
        if kv is not None and (kv % self.tp if kv >= self.tp else self.tp % kv):
            raise Unsupported(f"num_key_value_heads={kv} and the engine's tp={self.tp}: one must divide the "
                              "other for SGLang to split or replicate the K/V heads without padding")

    @classmethod
    def of_config(cls, config: dict, tp: int, device: str = "cpu") -> Sharding:
        """From a model's config.json (as a dict) at engine TP `tp` on `device`. MLA (`kv_lora_rank`) has no K/V
        heads."""
        heads = config.get("num_attention_heads")
        kv = None if config.get("kv_lora_rank") else config.get("num_key_value_heads", heads)
        return cls(tp, heads, kv, device)

    def pieces(self, name: str, shape: tuple[int, ...]) -> list[Piece | None]:
        """Per rank, the piece of the engine-shaped HF tensor `name` (shape `shape`: padded as the engine pads
        it) that rank holds; None: the whole tensor (replicated, or tp 1)."""
        if self.tp == 1 or _REPLICATED.search(name):
            return [None] * self.tp
        dim = self._dim(name)
        if dim >= len(shape) or shape[dim] % self.tp:
            raise Unsupported(f"{name!r}: dim {dim} of shape {tuple(shape)} does not split into tp={self.tp} "
                              "equal parts")
        if _KV.search(name) and self.kv_heads is not None and self.kv_heads < self.tp:
            per_head = shape[0] // self.kv_heads
            return [(0, (r // (self.tp // self.kv_heads)) * per_head, per_head) for r in range(self.tp)]
        n = shape[dim] // self.tp
        return [(dim, r * n, n) for r in range(self.tp)]

    def _dim(self, name: str) -> int:
        if name in VOCAB or _ROWS.search(name) or _KV.search(name):
            return 0
        if _COLS.search(name):
            return 1
        raise Unsupported(f"{name!r}: labkit has no rule for how an engine at tp={self.tp} splits this tensor "
                          "(labkit.engine.shard); sync into a tp 1 engine")

    def spec(self) -> dict:
        return {"tp": self.tp, "heads": self.heads, "kv_heads": self.kv_heads, "device": self.device}

