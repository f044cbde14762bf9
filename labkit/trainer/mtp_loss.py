"""The MTP loss during RL with the trunk detached: the draft learns the policy; the policy never learns from the draft.

Megatron-core 0.16.1 has no `mtp_detach_heads` (upstream PR #3456, 2026-06), so these forward hooks do what
it does, on any GPTModel with an MTP block:
  - the first MTP layer reads the trunk's hidden states detached;
  - every MTP layer re-embeds its shifted tokens through the shared embedding, detached;
  - the MTP logits use a detached output weight.
MTP-loss gradients then reach only the MTP layers' own parameters (enorm, hnorm, eh_proj, the layer, its final
norm). The main logits still come from the attached trunk, so the policy loss is untouched.

`policy_loss` gives the other draft targets: rather than cross-entropy on the one sampled token, the MTP head at
t matches the main head's whole distribution at t+d, already in the same forward: KL (for on-policy rollouts its
gradient has the sampled CE's expectation with less noise), top-k soft CE (SkyRL), or total variation (Bebop),
the quantity speculative acceptance (1 - TV(p, q)) rewards directly.

Megatron clips one global grad norm over all parameters, so a large MTP gradient could still shrink the policy's
update through the clip coefficient; labkit.trainer.clip gives the MTP layers their own norm group
(TrainConfig.mtp_clip="own", as upstream PR #4116 does).

Why this lives in trainer/ (not injected from mtp/): every function here is a hook on, or a read of, the Megatron
GPTModel that `TrainerRank` builds and steps (its MTP block, output layer, shared embedding), switched by the
trainer's own `TrainConfig` fields (mtp_loss_scale, mtp_detach, mtp_target); Megatron's MTP cross-entropy is
already computed inside that forward. An injected loss object would make the trainer's configs silently do
nothing without it, and it would still have to reach into the same Megatron modules. So the MTP loss is the
trainer's model-forward concern, imported from here (labkit.mtp cites it; imports point down).
"""

from __future__ import annotations


class _Detached:
    """Calls the shared embedding and detaches its output (the MTP layer only ever calls it)."""

    def __init__(self, embedding):
        self.embedding = embedding

    def __call__(self, *args, **kwargs):
        return self.embedding(*args, **kwargs).detach()


def detach_trunk(model) -> list:
    """Install the hooks on one model chunk (DDP-wrapped or not); returns the hook handles (empty without MTP)."""
    from megatron.core.utils import unwrap_model

    inner = unwrap_model(model)
    if not getattr(inner, "mtp_process", False) or not inner.config.mtp_num_layers:
        return []
    layers = inner.mtp.layers

    def first_layer(module, args, kwargs):
        kwargs["hidden_states"] = kwargs["hidden_states"].detach()
        return args, kwargs

    def each_layer(module, args, kwargs):
        if kwargs.get("embedding") is not None:
            kwargs["embedding"] = _Detached(kwargs["embedding"])
        return args, kwargs

    # GPTModel calls output_layer once per MTP depth right after the MTP block, then once for the main
    # logits: arm a counter when the block runs so exactly the MTP calls get the detached weight.
    pending = [0]

    def armed(module, args, output):
        pending[0] = inner.config.mtp_num_layers

    def output_layer(module, args, kwargs):
        if pending[0] > 0:
            pending[0] -= 1
            w = kwargs.get("weight")
            kwargs["weight"] = (module.weight if w is None else w).detach()
        return args, kwargs

    handles = [layers[0].register_forward_pre_hook(first_layer, with_kwargs=True)]
    handles += [layer.register_forward_pre_hook(each_layer, with_kwargs=True) for layer in layers]
    handles.append(inner.mtp.register_forward_hook(armed))
    handles.append(inner.output_layer.register_forward_pre_hook(output_layer, with_kwargs=True))
    return handles


def freeze_mtp(model) -> int:
    """Take the MTP layers out of training (no grad, so the optimizer never sees them); returns how many tensors."""
    n = 0
    for name, p in model.named_parameters():
        if ".mtp." in f".{name}":
            p.requires_grad_(False)
            n += 1
    return n


def capture_mtp(model, into: dict):
    """Forward hook keeping the MTP block's output ([main; depth 1; ...] hidden states, stacked on dim 0)."""
    from megatron.core.utils import unwrap_model

    inner = unwrap_model(model)
    if not getattr(inner, "mtp_process", False) or not inner.config.mtp_num_layers:
        return None
    return inner.mtp.register_forward_hook(lambda m, i, o: into.__setitem__("mtp_hidden", o))


TOPK = 8  # SkyRL's soft CE keeps the target's top-k probabilities, renormalised
DSPARK = (0.1, 0.9)  # DSpark's weights of cross-entropy and total variation (NeMo-RL #3698 / #3713)


def distance(target, q, kind: str):
    """Per-position loss of the draft's log-probs `q` against the main head's `target` ([..., V] each):
    policy  KL(p || q) (labkit's default policy target);
    topk    cross-entropy against p restricted to its TOPK largest entries and renormalised (SkyRL);
    tv      total variation 0.5 * sum |p - q| (Bebop), the quantity acceptance 1 - TV(p, q) rewards directly;
    dspark  0.1 * cross-entropy -sum p log q + 0.9 * total variation (DSpark, shipped in NeMo-RL): TV for what
            acceptance rewards, the cross-entropy for a gradient where TV's vanishes (q far from p)."""
    p = target.exp()
    if kind == "policy":
        return (p * (target - q)).sum(-1)
    if kind == "topk":
        top, idx = p.topk(min(TOPK, p.shape[-1]), dim=-1)
        return -((top / top.sum(-1, keepdim=True)) * q.gather(-1, idx)).sum(-1)
    if kind == "tv":
        return 0.5 * (p - q.exp()).abs().sum(-1)
    if kind == "dspark":
        ce, tv = DSPARK
        return ce * -(p * q).sum(-1) + tv * 0.5 * (p - q.exp()).abs().sum(-1)
    raise ValueError(f"kind={kind!r} is invalid: expected policy, topk, tv or dspark")


def policy_loss(model, hidden, loss_mask, kind: str = "policy"):
    """Mean over drafted targets of `distance(main head at t+d, MTP depth d at t, kind)`, averaged over depths.

    Drafted targets: the token the main head reads at t+d is itself a response token. The first response
    token always comes from the target's prefill, so a draft is never asked for it.

    `hidden`: the MTP block's output [(1 + n) * s, b, h]; `loss_mask` [b, s] marks targets (position j's
    target is token j+1). Gradients reach only the MTP layers: the target, the output weight and (through
    `detach_trunk`) the MTP inputs are all detached.
    """
    import torch
    from megatron.core.utils import unwrap_model

    inner = unwrap_model(model)
    n = inner.config.mtp_num_layers
    parts = torch.chunk(hidden, 1 + n, dim=0)
    w = (inner.shared_embedding_or_output_weight() if inner.share_embeddings_and_output_weights
         else inner.output_layer.weight).detach()

    def logp(h):
        return torch.log_softmax(inner.output_layer(h, weight=w, runtime_gather_output=True)[0].float(), dim=-1)

    p = logp(parts[0].detach())  # [s, b, V]
    mask = loss_mask.t().float()  # [s, b]
    total = p.new_zeros(())
    for d in range(1, n + 1):
        # Depth d at position t predicts token t+1+d, as the main head does at position t+d.
        target, q, m = p[d:], logp(parts[d])[:-d], mask[d:] * mask[d - 1:-1]
        total = total + (distance(target, q, kind) * m).sum() / m.sum().clamp(min=1)
    return total / n
