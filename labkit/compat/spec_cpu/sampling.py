"""Speculative verification at temperature > 0 on a CPU engine, as SGLang verifies it on GPU.

SGLang 0.5.23 verifies greedily on CPU whatever the request's temperature: `_verify_uses_greedy(is_cpu=True)` is
True (`speculative/eagle_utils.py:485-500`) and `tree_speculative_sampling_target_only` is None off CUDA/MUSA
(`kernels/ops/speculative/verify_sampling.py`). The engine then samples only the prefill token and takes the
argmax at every verify step: silently a greedy generation (measured: 23 of 32 outputs at T = 1 equal to the greedy
run's). Here the target-only rule runs in torch, a line-for-line port of SGLang's
`TreeSpeculativeSamplingTargetOnly` (`kernels/jit/include/sgl_kernel/speculative/sampling.cuh`): a draft token x
is accepted with probability p(x) (the target's, after temperature/top-k/top-p), and at the first rejection the
token is drawn from p with the rejected drafts removed, so every emitted token is distributed as the target's.
SGLang's other rule (`speculative_use_rejection_sampling`, min(1, p/q) with the draft's q) runs through Triton
kernels with no CPU version; a CPU engine started with it refuses its first sampled verify (`NotImplementedError`
naming the setting). The verify step renormalizes the target's probabilities by each request's top-k and top-p
with FlashInfer's kernels, None on CPU: a mixed greedy and sampled batch needs them too (SGLang runs a greedy
request as top-k 1), so torch versions stand in (`top_k_renorm_prob`, `top_p_renorm_prob`).
"""

from __future__ import annotations

import torch


def _draw(relu: torch.Tensor, coin: float) -> int:
    """FlashInfer's `DeviceSamplingFromProb` over relu(q - p): the first index whose running sum passes
    coin * total; where rounding leaves none, the last index with mass (else the last index)."""
    cdf = relu.double().cumsum(0)
    u = coin * float(cdf[-1])
    i = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True))
    if i < relu.numel():
        return i
    nz = torch.nonzero(relu > 0)
    return int(nz[-1]) if nz.numel() else relu.numel() - 1


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True) -> None:
    """SGLang's kernel of the same name and arguments (`deterministic` only orders the GPU's block sums)."""
    bs, n = candidates.shape
    spec = accept_index.shape[1]
    probs, dprobs = target_probs.reshape(bs, n, -1), draft_probs.view(bs, n, -1)
    coins, final = uniform_samples.reshape(bs, n).tolist(), uniform_samples_for_final_sampling.reshape(-1).tolist()
    for b in range(bs):
        cand, ridx = candidates[b].tolist(), retrive_index[b].tolist()
        nxt, sib = retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist()
        row, coin, acc = 0, coins[b][0], 0.0
        last = ridx[0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, spec):
            cur = nxt[cur]
            while cur != -1:
                tok = cand[cur]
                p = float(probs[b, row, tok])
                acc += p
                if p > 0 and (coin < acc / threshold_acc or p >= threshold_single):
                    acc, row, coin = 0.0, cur, coins[b][cur]
                    predicts[last] = tok
                    accepted += 1
                    accept_index[b, accepted] = ridx[cur]
                    last = ridx[cur]
                    break
                dprobs[b, row, tok] = probs[b, row, tok]  # rejected: out of the residual
                cur = sib[cur]
            if cur == -1:
                break
        accept_token_num[b] = accepted
        q = probs[b, row]
        relu = q if accepted == spec - 1 else (q - dprobs[b, row]).clamp_min(0)  # no draft after the last
        predicts[last] = _draw(relu, final[b])


def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """Each row kept to its top_ks[i] largest probabilities (ties at the k-th kept), renormalized."""
    k = top_ks.view(-1, 1).long().clamp(1, probs.shape[-1])
    kth = probs.sort(-1, descending=True).values.gather(-1, k - 1)
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Each row kept to the smallest set of its largest probabilities whose mass reaches top_ps[i] (SGLang's torch
    sampler's rule: a token stays while the mass before it is below top_p), renormalized."""
    ordered, idx = probs.sort(-1, descending=True)
    keep = (ordered.cumsum(-1) - ordered) < top_ps.view(-1, 1).to(probs.dtype)
    mask = torch.zeros_like(keep).scatter(-1, idx, keep)
    kept = torch.where(mask, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def _sampling_verify_on_cpu(plain):
    def verify_uses_greedy(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling):
        if is_cpu and use_rejection_sampling and not is_all_greedy:
            raise NotImplementedError("labkit spec_cpu: speculative_use_rejection_sampling runs Triton kernels "
                                      "SGLang has no CPU version of; the CPU engine verifies target-only")
        return plain(is_all_greedy=is_all_greedy, is_cpu=False, is_hip=is_hip, is_xpu=is_xpu,
                     use_rejection_sampling=use_rejection_sampling)

    verify_uses_greedy.labkit_spec = True
    return verify_uses_greedy


def patch_verify_sampling() -> None:
    from sglang.srt.speculative import eagle_utils

    if getattr(eagle_utils._verify_uses_greedy, "labkit_spec", False):
        return
    eagle_utils._verify_uses_greedy = _sampling_verify_on_cpu(eagle_utils._verify_uses_greedy)
    eagle_utils.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only
    if eagle_utils.top_k_renorm_prob is None:
        eagle_utils.top_k_renorm_prob = top_k_renorm_prob
    if eagle_utils.top_p_renorm_prob is None:
        eagle_utils.top_p_renorm_prob = top_p_renorm_prob
