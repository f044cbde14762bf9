"""What labkit adds to every SGLang model class it serves: reading a weight back by its HF name, the slice of an
engine parameter that holds it, and routing labkit's payloads to labkit's loader.

- `get_weights_by_name`: SGLang 0.5.23's MiMo, Qwen3-MoE and DeepSeek-V3 lack it (Llama has it);
  without it `Engine.get_weights_by_name` answers None and a bitwise check has nothing to read. The reply follows
  SGLang's convention (Llama's): the tensor in float32 (exact for fp32/bf16/fp16) as a nested list, truncated to
  `truncate_size` rows, so it passes the scheduler's msgspec output and HTTP JSON unchanged.
- `param_view(hf_name)`: fused q/k/v and gate/up resolve to their row block (from the fused module's
  `output_sizes`), an expert's gate/up/down to its slice of FusedMoE's `w13_weight` [E, 2I, H] / `w2_weight`
  [E, H, I] (the true extent of a padded I: SGLang keeps it as `original_moe_intermediate_size`), vocabulary
  tables to their unpadded rows. labkit's copy plan (labkit.engine.inside.apply) writes into these views; None sends
  a tensor through the model's own `load_weights`.
- `load_weights`: a labkit payload (the distributed path receives a bucket as one tensor named by its layout)
  goes to labkit's loader; anything else to SGLang's, with the `engine.apply` failpoint when armed.
- the weight checker: constructing a labkit model makes SGLang's `check_weights` hash CPU tensors with xxh3
  (`install_checksum`; labkit.engine.checksum says why), and `get_weights_by_name(CHECKSUM_NAME)` says whether
  it did, so the trainer hashes its expectation the same way.
TP=1 only (at TP>1 each rank's loader cuts its own shard and labkit falls back to it).
"""

from __future__ import annotations

import logging
import sys

import torch

from labkit import failpoints as fp
from labkit.engine.inside import apply
from labkit.engine.inside import checkmemo
from labkit.engine import checksum as ck
from labkit.engine.inside import direct
from labkit.engine.inside.shardview import expert_view, shard_sizes
from labkit.engine.contract import fused_part

logger = logging.getLogger(__name__)

# checkpoint leftovers SGLang's own loaders skip everywhere
IGNORED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
EXPERT_PARAMS = ("w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv")
SCALE = "_scale_inv"  # a block-FP8 weight's scale (labkit.models.fp8): its rows are the weight's, one per block


class LabkitWeights:
    """Mixin, listed before SGLang's model class: `class X(LabkitWeights, SGLangX)`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        install_checksum()

    def load_weights(self, weights, *args, **kwargs):
        if isinstance(weights, list) and apply.routes(weights):
            return apply.load_flat(self, weights)
        if fp.engine_armed("engine.apply"):  # `labkit faults`: a failure in the middle of an apply
            weights = with_failpoint(weights)
        return super().load_weights(weights, *args, **kwargs)

    def param_view(self, name: str) -> tuple[str, torch.Tensor] | None:
        """(engine parameter name, the slice of it that holds HF tensor `name`), or None when `name` is not a
        plain copy into one. A tied lm_head is SGLang's loader's to skip."""
        if any(s in name for s in IGNORED) or (name == "lm_head.weight" and self.config.tie_word_embeddings):
            return None
        part = self.labkit_fused_part(name)
        target = name if part is None else part[0]
        try:
            weight = self.get_parameter(target).data
        except AttributeError:
            return None
        block = self._scale_block() if target.endswith(SCALE) else 1  # a scale has a row per block of rows
        if part is not None and target.endswith(EXPERT_PARAMS):
            true_ffn = getattr(self.config, "original_moe_intermediate_size", None)
            true_ffn = -(-true_ffn // block) if true_ffn else None
            return target, expert_view(weight, target.rsplit(".", 1)[1], part[1], true_ffn)
        owner = self.get_submodule(target.rsplit(".", 1)[0])
        if part is not None:
            sizes = [-(-n // block) for n in shard_sizes(owner)]
            rows = min(sizes[part[1]], -(-(self._true_ffn(target) or 0) // block) or sizes[part[1]])
            return target, weight.narrow(0, sum(sizes[:part[1]]), rows)
        if target.endswith(".mlp.down_proj.weight") or ".shared_experts.down_proj." in target:
            return target, weight.narrow(1, 0, self._true_ffn(target) or weight.shape[1])
        org = getattr(owner, "org_vocab_size", None)  # vocab-parallel tables are padded
        return target, (weight[:org] if org is not None and weight.shape[0] > org else weight)

    def labkit_fused_part(self, name: str):
        """`labkit.engine.contract.fused_part` for this model (a model fusing less overrides it)."""
        return fused_part(name)

    def _scale_block(self) -> int:
        """Rows of weight per row of a block-FP8 scale (SGLang's Fp8Config.weight_block_size[0])."""
        return int(self.quant_config.weight_block_size[0])

    def _true_ffn(self, target: str) -> int | None:
        """The checkpoint's width of the FFN block `target` belongs to, where a CPU engine padded it (SGLang keeps
        the true value as `original_<attr>`); None where nothing was padded or `target` is not an FFN block."""
        if ".mlp." not in target or not target.removesuffix(SCALE).endswith(("gate_up_proj.weight",
                                                                             "down_proj.weight")):
            return None
        cfg = self.config
        if ".shared_experts." in target:
            moe = getattr(cfg, "original_moe_intermediate_size", None)
            return moe * int(getattr(cfg, "n_shared_experts", 1) or 1) if moe else None
        return getattr(cfg, "original_intermediate_size", None)

    def get_weights_by_name(self, name: str, truncate_size: int = 100, tp_size: int = 1):
        if name == apply.STATS_NAME:
            return [apply.end_sync()]
        if name == ck.CHECKSUM_NAME:
            return [[int(_checksum_installed), checkmemo.MEMO.hits, int(checkmemo.MEMO.on)]]
        if name.startswith(direct.SHARE_PREFIX):  # transport="direct": share the parameters in place
            return direct.answer(self, name, tp_size)
        try:
            if tp_size != 1:
                raise NotImplementedError(f"labkit's get_weights_by_name reads TP=1 engines only (tp_size={tp_size})")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                name = "model.embed_tokens.weight"
            found = self.param_view(name)
            if found is None:
                raise KeyError(name)
            return found[1].detach().cpu().to(torch.float32).numpy().tolist()[:truncate_size]
        except Exception as e:  # SGLang's contract: log and answer None
            logger.error(f"labkit {type(self).__name__}.get_weights_by_name({name!r}) failed: {type(e).__name__}: {e}")
            return None


def install_checksum() -> bool:
    """SGLang 0.5.23's weight checker hashes each parameter through its module's `_hash_tensor`: from here on CPU
    tensors go to labkit's xxh3 and device tensors to labkit's device hash (labkit.engine.checksum), the
    functions the trainer hashes its expectation with.
    Pinned to the version it was read in; any other keeps SGLang's sha256, and `CHECKSUM_NAME` says so."""
    global _checksum_installed
    if _checksum_installed:
        return True
    if "sglang" not in sys.modules:  # a model built outside SGLang's scheduler (labkit bench device's stand-in)
        return False
    import sglang  # SGLang is crossed here only (inside its scheduler)
    from sglang.srt.utils import weight_checker as wc

    original = getattr(wc, "_hash_tensor", None)
    if sglang.__version__ != "0.5.23" or original is None:
        return False

    def _hash_tensor(t: torch.Tensor) -> str:
        return ck.checksum(t, "xxh3_64")  # xxh3 on CPU, labkit's device hash on GPU (labkit.engine.checksum)

    wc._hash_tensor = _hash_tensor
    # A block-FP8 weight is hashed as the bytes it holds, its fp8 weight and its scale apart, as the trainer hashes
    # what it sent (labkit.sync.quantize), not as SGLang's bf16 dequantization, which two different weight/scale
    # pairs can share and whose block size SGLang guesses from the shapes (`weight_checker_comparator.py:79-84`).
    wc.select_comparable_weight = lambda quant_method: None
    _checksum_installed = True
    _install_memo(wc.WeightChecker)
    return True


def _install_memo(checker_cls) -> None:
    """Answer a checksum request from labkit.engine.inside.checkmemo while no request since could have written weights:
    SGLang's checker consults the memo, the scheduler's dispatcher (built after the model, so patched here, in
    the scheduler's process, on its class) tells it about every request. Without the dispatcher (a model built
    outside a scheduler) the memo stays off."""
    import sys

    scheduler = sys.modules.get("sglang.srt.managers.scheduler")
    if scheduler is None or not hasattr(scheduler.Scheduler, "init_request_dispatcher"):
        return
    compute, init_dispatcher = checker_cls._compute_checksum, scheduler.Scheduler.init_request_dispatcher

    def _compute_checksum(self, skip_tensor_list=None, *, role):
        reply = checkmemo.MEMO.lookup(role, skip_tensor_list)
        if reply is None:
            reply = compute(self, skip_tensor_list, role=role)
            checkmemo.MEMO.store(role, skip_tensor_list, reply)
        return reply

    def init_request_dispatcher(self):
        init_dispatcher(self)
        inner = self._request_dispatcher

        def dispatch(request):
            checkmemo.MEMO.note(request)
            return inner(request)

        self._request_dispatcher = dispatch
        if getattr(getattr(getattr(self, "tp_worker", None), "model_runner", None), "eplb_manager", None):
            checkmemo.MEMO.disable("SGLang's expert rebalancer moves weights from inside the scheduler loop")
        else:
            checkmemo.MEMO.enable()

    checker_cls._compute_checksum = _compute_checksum
    scheduler.Scheduler.init_request_dispatcher = init_request_dispatcher


_checksum_installed = False


def with_failpoint(weights):
    for name, t in weights:  # SGLang's loader writes each tensor before it pulls the next
        fp.hit("engine.apply", name=name)
        yield name, t
