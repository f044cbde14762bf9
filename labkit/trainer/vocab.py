"""A vocabulary that TP does not divide, padded the way Megatron-LM pads it (`make_vocab_size_divisible_by`).

Megatron splits the embedding and the output layer by rows across TP ranks, so a checkpoint with 131 tokens at
TP=2 died inside a Ray actor with `AssertionError: 131 is not divisible by 2`. Here the Megatron model is built
with the vocabulary padded to a multiple of `DIVISOR * tp` (Megatron-LM's default 128); the checkpoint's rows
are loaded at the top and the padding rows are zero; the export drops them again, so the engine and every
exported tensor keep the checkpoint's true size.

The padding must not change the model: a zero output row still gives logit 0, which would take probability
mass in the softmax (Megatron-LM lets training push it down; a policy whose log-probs differ from the
checkpoint's is wrong for RL). So the output layer's padded logits are masked to the dtype's minimum: the loss,
its gradient (zero on the padding rows, which stay zero) and the returned logits are those of the true
vocabulary, and the full logits a caller gathers are cut to it.
Applied only where TP does not divide the vocabulary: every other layout is built exactly as before.
"""

from __future__ import annotations

import torch

DIVISOR = 128  # Megatron-LM's --make-vocab-size-divisible-by default
TABLES = ("embedding.word_embeddings.weight", "output_layer.weight")


def padded_size(vocab: int, tp: int) -> int:
    """The vocabulary Megatron is built with: `vocab` itself where TP divides it, else the next multiple of
    DIVISOR * tp."""
    if vocab % tp == 0:
        return vocab
    step = DIVISOR * tp
    return -(-vocab // step) * step


def pad_vocab(bridge, tp: int) -> None:
    """Build, load and export `bridge`'s model with a padded vocabulary when TP does not divide it."""
    vocab = int(bridge.hf_config.vocab_size)
    size = padded_size(vocab, tp)
    if size == vocab:
        return
    base_args, to_mcore, to_hf = bridge._get_gptmodel_args, bridge._weight_to_mcore_format, bridge._weight_to_hf_format
    base_model = bridge.get_model

    def gptmodel_args():
        return {**base_args(), "vocab_size": size}

    def weight_to_mcore(name, hf_weights):
        w = to_mcore(name, hf_weights)
        if name.endswith(TABLES) and w.shape[0] == vocab:
            w = torch.cat([w, w.new_zeros((size - vocab, *w.shape[1:]))])
        return w

    def weight_to_hf(name, w):
        names, ws = to_hf(name, w)
        if name.endswith(TABLES):
            ws = [x[:vocab] if x.shape[0] == size else x for x in ws]
        return names, ws

    def get_model(*args, **kwargs):
        models = base_model(*args, **kwargs)
        for m in models:
            layer = getattr(_unwrap(m), "output_layer", None)
            if layer is not None:
                layer.register_forward_hook(_mask(vocab, size, tp))
        return models

    bridge._get_gptmodel_args, bridge.get_model = gptmodel_args, get_model
    bridge._weight_to_mcore_format, bridge._weight_to_hf_format = weight_to_mcore, weight_to_hf


def _unwrap(model):
    while hasattr(model, "module"):
        model = model.module
    return model


def _mask(vocab: int, size: int, tp: int):
    """The output layer's forward hook: a gathered output ([..., size]) is cut to the true vocabulary; this
    rank's partition ([..., size / tp]) gets its padding columns set to the dtype's minimum."""

    def hook(module, args, output):
        logits, bias = output
        if logits.shape[-1] == size:
            return logits[..., :vocab], bias
        from megatron.core import parallel_state as ps  # Megatron is crossed here only (inside the trainer)

        start = ps.get_tensor_model_parallel_rank() * logits.shape[-1]
        cut = max(0, min(logits.shape[-1], vocab - start))
        if cut == logits.shape[-1]:
            return output
        keep = torch.arange(logits.shape[-1], device=logits.device) < cut
        return logits.masked_fill(~keep, torch.finfo(logits.dtype).min), bias

    return hook
