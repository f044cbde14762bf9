"""labkit.compat.spec_cpu: the torch kernels against SGLang's Triton kernels, and verification at T > 0 that samples
the target's distribution (a chi-square test, with SGLang's CPU rule, greedy, as the control that fails it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from labkit.compat.spec_cpu import kernels as K
from labkit.compat.spec_cpu.sampling import top_k_renorm_prob, top_p_renorm_prob, tree_speculative_sampling_target_only

HERE = Path(__file__).resolve().parent


def test_kernels_match_sglangs_triton_kernels_run_by_the_interpreter():
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
    out = subprocess.run([sys.executable, str(HERE / "spec_kernels_triton.py"), "0"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _chain(bs: int, n: int):
    """`bs` copies of one request whose tree is a chain of n - 1 drafts: retrieve links as SGLang builds them."""
    r = torch.full((3, bs, n), -1, dtype=torch.long)
    K.build_tree_kernel_efficient_cpu(torch.arange(-1, n - 2).expand(bs, -1) if n > 2 else torch.empty(bs, 0,
                                      dtype=torch.long), torch.arange(n - 1).expand(bs, -1), torch.full((bs,), 5),
                                      torch.ones(n * n * bs, dtype=torch.bool), torch.zeros(bs * n, dtype=torch.long),
                                      r[0], r[1], r[2], 1, n - 1, n, K.QLEN_ONLY)
    return r


def _verify(rule: str, probs: torch.Tensor, drafts: list[int], bs: int, seed: int):
    n, vocab = probs.shape
    r = _chain(bs, n)
    candidates = torch.tensor([[0, *drafts]] * bs)
    pred = torch.zeros(bs * n, dtype=torch.int32)
    acc = torch.full((bs, n), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    if rule == "greedy":  # SGLang's CPU lane at any temperature
        K.verify_tree_greedy_cpu(pred, acc, num, candidates, r[0], r[1], r[2], probs.argmax(-1).expand(bs, -1))
    else:
        g = torch.Generator().manual_seed(seed)
        target = probs.expand(bs, -1, -1).contiguous()
        tree_speculative_sampling_target_only(pred, acc, num, candidates, r[0], r[1], r[2],
                                              torch.rand(bs, n, generator=g), torch.rand(bs, generator=g),
                                              target, torch.zeros_like(target))
    first = pred[acc[:, 0].long()]
    second = pred[acc[:, 1].long().clamp_min(0)]
    return first, second, num


def _chi2(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """p-value of `tokens` drawn from `p` (tokens p gives no mass to make it 0)."""
    seen = torch.bincount(tokens.long(), minlength=p.numel()).double()
    if (seen[p == 0] > 0).any():
        return 0.0
    keep = p > 0
    expected = p[keep].double() / p[keep].double().sum() * seen[keep].sum()
    return float(chisquare(seen[keep], expected).pvalue)


@pytest.mark.parametrize("rule, passes", [("target_only", True), ("greedy", False)])
def test_verified_tokens_are_distributed_as_the_target(rule, passes):
    torch.manual_seed(3)
    probs = torch.distributions.Dirichlet(torch.ones(6)).sample((3,))  # 2 drafts: 3 target distributions
    drafts = [int(probs[0].argsort()[-2]), int(probs[1].argmax())]  # a likely, not the likeliest, first draft
    bs = 4000
    first, second, num = _verify(rule, probs, drafts, bs, seed=11)
    p_first = _chi2(first, probs[0])
    took = num > 0  # the first draft was accepted: the next token is drawn from the target after it
    p_second = _chi2(second[took], probs[1]) if took.sum() > 50 else 0.0
    assert (min(p_first, p_second) > 1e-3) == passes, (p_first, p_second)


def test_acceptance_rate_is_the_target_probability_of_the_draft():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])
    _, _, num = _verify("target_only", probs, [1], 20000, seed=0)
    assert abs(float(num.float().mean()) - 0.3) < 0.015
    _, _, num = _verify("target_only", probs, [3], 2000, seed=1)  # no target mass: never accepted
    assert int(num.sum()) == 0


def test_top_k_and_top_p_renormalize_as_sglangs_torch_sampler():
    """The verify step's renormalization (FlashInfer's on GPU, None on CPU): a greedy request in a sampled batch
    runs as top-k 1."""
    p = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    k = top_k_renorm_prob(p, torch.tensor([1, 2]))
    assert torch.equal(k[0], torch.tensor([0.0, 1.0, 0.0, 0.0])) and k[1].sum() == 1 and (k[1] > 0).sum() >= 2
    assert torch.allclose(top_k_renorm_prob(p, torch.tensor([9, 4])), p)
    tp = top_p_renorm_prob(p, torch.tensor([0.5, 1.0]))  # 0.4 + 0.3 reach 0.5: those two, renormalized
    assert torch.allclose(tp[0], torch.tensor([0.0, 4 / 7, 0.0, 3 / 7])) and torch.allclose(tp[1], p[1])
