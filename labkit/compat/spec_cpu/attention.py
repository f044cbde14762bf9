"""SGLang's torch_native attention backend taught the two forwards speculative decoding adds (top-k 1 chains).

- **Verify** (TARGET_VERIFY): the target scores a request's `num_draft_tokens` tokens (the bonus token and its
  drafts) after its verified prefix. `ForwardBatch.init_new` leaves `extend_prefix_lens` and `extend_seq_lens`
  unset in this mode (torch_native then fails with `AttributeError: 'NoneType' object has no attribute 'shape'`);
  they are derived here as SGLang's intel_amx backend derives them (`_build_extend_metadata`): prefix = seq_lens,
  extend = num_draft_tokens, kv = seq_lens + num_draft_tokens. A chain's drafts see exactly their predecessors,
  which is the causal mask torch_native already applies; a top-k > 1 tree would need its tree mask, so it is
  refused.
- **Draft decode** (num_steps >= 2): draft step i reads the prefix plus the i + 1 drafts written so far, whose KV
  slots follow the prefix in the request's row (`assign_draft_cache_locs_contiguous`, top-k 1), so each step is a
  plain decode over seq_lens + i + 1 (intel_amx's `IntelAMXMultiStepDraftBackend`, without its C++ metadata op).
- `DraftBackendFactory` gets the torch_native entries it lacks (`ValueError: EAGLE is not supported in attention
  backend torch_native`, raised even at num_steps 1).
"""

from __future__ import annotations

import contextlib

import torch

BACKEND = "torch_native"


def _torch_native_cls():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend


@contextlib.contextmanager
def _verify_fields(forward_batch):
    """The extend fields of a verify batch, for the duration of one attention call."""
    spec = forward_batch.spec_info
    if spec.tree_topk != 1:
        raise NotImplementedError(f"labkit spec_cpu: speculative_eagle_topk={spec.tree_topk}: the CPU verify "
                                  "runs top-k 1 chains only (a tree needs its mask in torch_native)")
    n, seq = spec.draft_token_num, forward_batch.seq_lens
    saved = (forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens, seq)
    forward_batch.extend_prefix_lens = seq
    forward_batch.extend_seq_lens = torch.full_like(seq, n)
    forward_batch.seq_lens = seq + n
    try:
        yield
    finally:
        forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens, forward_batch.seq_lens = saved


def patch_verify() -> None:
    cls = _torch_native_cls()
    if getattr(cls.forward_extend, "labkit_spec", False):
        return
    plain = cls.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if not forward_batch.forward_mode.is_target_verify():
            return plain(self, q, k, v, layer, forward_batch, save_kv_cache)
        with _verify_fields(forward_batch):
            return plain(self, q, k, v, layer, forward_batch, save_kv_cache)

    forward_extend.labkit_spec = True
    cls.forward_extend = forward_extend


def _draft_step_cls():
    class DraftStepBackend(_torch_native_cls()):
        """Draft step `offset - 1`: a decode over the prefix and the `offset` drafts written so far."""

        def __init__(self, model_runner, offset: int):
            super().__init__(model_runner)
            self.offset = offset

        def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                     seq_lens, *args, **kwargs):
            return super()._run_sdpa_forward_decode(query, output, k_cache, v_cache, req_to_token,
                                                    req_pool_indices, seq_lens + self.offset, *args, **kwargs)

    return DraftStepBackend


class ChainDraftBackend:
    """The multi-step draft-decode backend for a top-k 1 chain: one torch_native step backend per draft step
    after the first (the first draft comes from the draft-extend forward)."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        if topk != 1:
            raise NotImplementedError(f"labkit spec_cpu: speculative_eagle_topk={topk}: CPU draft decode runs "
                                      "top-k 1 chains only")
        self.topk, self.speculative_num_steps = topk, speculative_num_steps
        step = _draft_step_cls()
        self.attn_backends = [step(model_runner, i + 1) for i in range(speculative_num_steps - 1)]
        for b in self.attn_backends:
            b.prefill_attention_backend_str = b.decode_attention_backend_str = BACKEND

    def init_forward_metadata(self, forward_batch) -> None:
        for b in self.attn_backends:
            b.init_forward_metadata(forward_batch)


def _configured(factory, decode: bool) -> str:
    from sglang.srt.runtime_context import attention_backends

    prefill, dec = attention_backends()
    return factory.draft_attn_backend or (dec if decode else prefill)


def patch_draft_factory() -> None:
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.draft_utils import DraftBackendFactory as F

    if getattr(F.create_decode_backend, "labkit_spec", False):
        return
    plain_decode, plain_extend = F.create_decode_backend, F.create_draft_extend_backend

    def create_decode_backend(self):
        if self.speculative_num_steps <= 1 or _configured(self, True) != BACKEND:
            return plain_decode(self)
        return ChainDraftBackend(self.draft_model_runner, self.topk, self.speculative_num_steps)

    def create_draft_extend_backend(self):
        decode = get_spec().speculative_attention_mode == "decode"
        if _configured(self, decode) != BACKEND:
            return plain_extend(self)
        backend = _torch_native_cls()(self.draft_model_runner)
        backend.prefill_attention_backend_str = backend.decode_attention_backend_str = BACKEND
        return backend

    create_decode_backend.labkit_spec = create_draft_extend_backend.labkit_spec = True
    F.create_decode_backend, F.create_draft_extend_backend = create_decode_backend, create_draft_extend_backend
