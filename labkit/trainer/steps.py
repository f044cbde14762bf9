"""The step functions Megatron's pipeline schedule calls on every rank (labkit.trainer.rank): the batch as
Megatron wants it, the policy forward with its loss (plus the MTP heads' KL when they train), and a forward that
only captures logits (the main head's and each MTP head's)."""

from __future__ import annotations

import torch

from labkit.trainer.mtp_loss import capture_mtp, policy_loss


def make_batch(tokens, loss_mask, weights):
    """Targets one to the left, the loss mask on them, per-sequence weights, positions; on the model's device (a
    GPU rank's model is on its CUDA device while callers hand it CPU tensors)."""
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    tokens = tokens.long().to(dev)
    labels = torch.roll(tokens, -1, dims=1)
    mask = torch.roll(loss_mask.float().to(dev), -1, dims=1)  # mask marks *target* tokens; predictor one to the left
    mask[:, -1] = 0.0
    w = mask if weights is None else mask * weights.float().to(dev).view(-1, 1)
    pos = torch.arange(tokens.shape[1], device=dev).unsqueeze(0).expand_as(tokens).contiguous()
    return {"tokens": tokens, "labels": labels, "loss_mask": mask, "weights": w, "position_ids": pos}


def forward_step(data_iterator, model, total_tokens: float, policy_scale: float = 1.0, kl_scale: float = 0.0,
                  kind: str = "policy"):
    b = next(data_iterator)
    captured: dict = {}
    hook = capture_mtp(model, captured) if kl_scale else None
    try:
        # Megatron uses loss_mask only for the MTP loss; the policy loss below applies the per-sequence weights.
        out = model(b["tokens"], b["position_ids"], None, labels=b["labels"], loss_mask=b["loss_mask"])
    finally:
        if hook:
            hook.remove()

    def loss_func(output_tensor):
        # Normalise by the whole batch's token count (not the weighted sum: advantages sum to ~0 per group) so
        # micro-batching and PP give the same loss.
        loss = (output_tensor.float() * b["weights"]).sum() / total_tokens
        logs = {"lm loss": loss.detach()}
        total = loss * policy_scale
        if "mtp_hidden" in captured:
            kl = policy_loss(model, captured.pop("mtp_hidden"), b["loss_mask"], kind)
            total, logs["mtp kl"] = total + kl_scale * kl, kl.detach()
        return total, logs

    return out, loss_func


def logits_step(data_iterator, model, captured: dict):
    from megatron.core.utils import unwrap_model

    b = next(data_iterator)
    inner = unwrap_model(model)
    mtp = getattr(inner, "mtp_process", False) and inner.config.mtp_num_layers
    hook = inner.mtp.register_forward_hook(lambda m, i, o: captured.__setitem__("_h", o)) if mtp else None
    try:
        # labels=None crashes GPTModel with MTP (labels.clone()); pass dummies and read the heads' hidden states.
        dummy = torch.zeros_like(b["tokens"]) if mtp else None
        out = model(b["tokens"], b["position_ids"], None, labels=dummy, loss_mask=dummy,
                    runtime_gather_output=True)
    finally:
        if hook:
            hook.remove()

    def loss_func(output_tensor):
        if inner.post_process:
            if mtp:
                w = inner.shared_embedding_or_output_weight() if inner.share_embeddings_and_output_weights else None
                parts = torch.chunk(captured.pop("_h"), 1 + inner.config.mtp_num_layers, dim=0)
                logits = [inner.output_layer(p, weight=w, runtime_gather_output=True)[0].transpose(0, 1).float()
                          for p in parts]
                captured["logits"], captured["mtp_logits"] = logits[0], logits[1:]
            else:
                captured["logits"], captured["mtp_logits"] = output_tensor.float(), []
        return output_tensor.float().sum() * 0.0, {}

    return out, loss_func
