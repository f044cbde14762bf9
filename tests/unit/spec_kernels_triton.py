"""labkit.compat.spec_cpu.kernels against the Triton kernels SGLang runs on GPU, run here by Triton's interpreter.

Run as a script (`TRITON_INTERPRET=1` must be set before SGLang's kernels are decorated, so not inside pytest's
process): random EAGLE trees built the way SGLang's draft builds them (`select_top_k_tokens`,
`organize_draft_results`), each kernel run both ways, and the first difference per kernel printed as JSON (none: `[]`).
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from sglang.kernels.ops.speculative import cache_locs, eagle, spec_tree  # noqa: E402
from sglang.srt.mem_cache import allocation  # noqa: E402
from sglang.srt.speculative import eagle_utils, spec_utils  # noqa: E402

from labkit.compat.spec_cpu import kernels as K  # noqa: E402

bad: list[dict] = []


def same(name: str, case, ours, theirs) -> None:
    if any(b["kernel"] == name for b in bad):  # the first difference per kernel
        return
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not torch.equal(a.long() if a.dtype != torch.bool else a, b.long() if b.dtype != torch.bool else b):
            bad.append({"kernel": name, "case": case, "output": i, "ours": a.tolist(), "triton": b.tolist()})
            return


def tree(g, bs: int, topk: int, steps: int, n: int, vocab: int = 50):
    """parent_list, top_scores_index, draft tokens of a random draft (SGLang's own selection code)."""
    later = getattr(spec_utils._select_top_k_tokens_later, "_torchdynamo_orig_callable",
                    spec_utils._select_top_k_tokens_later)
    scores_, tokens_, parents_ = [], [], []
    scores = None
    for i in range(steps):
        rows = bs if i == 0 else bs * topk
        p = torch.rand(rows, topk, generator=g).sort(dim=1, descending=True).values
        idx = torch.randint(vocab, (rows, topk), generator=g)
        if i == 0:
            _, _, scores, info = spec_utils._select_top_k_tokens_first(p, idx, None, topk)
        else:
            _, _, scores, info = later(i, p, idx, None, scores, topk)
        scores_.append(info[0]), tokens_.append(info[1]), parents_.append(info[2])
    return eagle_utils.organize_draft_results(scores_, tokens_, parents_, n)


def check_tree(g, case) -> None:
    bs, topk, steps = case
    n = 1 + (steps if topk == 1 else min(steps * topk, 1 + (steps - 1) * topk * topk) - 1)
    parent_list, sel, drafts = tree(g, bs, topk, steps, n)
    seq = torch.randint(3, 20, (bs,), generator=g)
    for mode in (K.FULL_MASK, K.QLEN_ONLY):
        size = (int(seq.sum()) * n + n * n * bs) if mode == K.FULL_MASK else n * n * bs
        outs = []
        for fn in (K.build_tree_kernel_efficient_cpu, spec_tree.sgl_build_tree_kernel_triton):
            mask = torch.ones(size, dtype=torch.bool)
            pos = torch.zeros(bs * n, dtype=torch.long)
            r = torch.full((3, bs, n), -1, dtype=torch.long)
            fn(parent_list, sel, seq, mask, pos, r[0], r[1], r[2], topk, steps, n, spec_tree.TreeMaskMode(mode))
            outs.append((mask, pos, r[0], r[1], r[2]))
        same(f"build_tree mode {mode}", case, *outs)
    r = outs[0][2:]
    candidates = torch.cat([torch.randint(50, (bs, 1), generator=g), drafts], dim=1)
    # targets that follow the drafts for a while: matches at several depths, not only at the root
    target = torch.where(torch.rand(bs, n, generator=g) < 0.6, candidates.roll(-1, 1), torch.randint(50, (bs, n),
                                                                                                       generator=g))
    outs = []
    for fn in (K.verify_tree_greedy_cpu, spec_tree.verify_tree_greedy_triton):
        pred = torch.zeros(bs * n, dtype=torch.int32)
        acc = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        num = torch.zeros(bs, dtype=torch.int32)
        fn(pred, acc, num, candidates, r[0], r[1], r[2], target)
        outs.append((pred, acc, num))
    same("verify_tree_greedy", case, *outs)


def check_cache_locs(g, bs: int) -> None:
    pool_len, rows = 64, bs + 3
    r2t = torch.randint(1000, (rows, pool_len), generator=g, dtype=torch.int32)
    rp = torch.randperm(rows, generator=g)[:bs]
    start = torch.randint(0, 20, (bs,), generator=g)
    end = start + torch.randint(0, 12, (bs,), generator=g)
    total = int((end - start).sum())
    locs = torch.randint(1000, (total,), generator=g)
    a, b = r2t.clone(), r2t.clone()
    K.assign_req_to_token_pool_cpu(rp, a, start, end, locs, pool_len)
    allocation.assign_req_to_token_pool[(bs,)](rp, b, start, end, locs, pool_len, 16)
    same("assign_req_to_token_pool", bs, (a,), (b,))
    oa, ob = torch.zeros(total, dtype=torch.int64), torch.zeros(total, dtype=torch.int64)
    K.assign_extend_cache_locs_cpu(rp, r2t, start, end, oa, pool_len)
    cache_locs.assign_extend_cache_locs[(bs,)](rp, r2t, start, end, ob, pool_len, 16)
    same("assign_extend_cache_locs", bs, (oa,), (ob,))
    topk, steps = 2, 3
    oa, ob = torch.zeros(bs * topk * steps, dtype=torch.int64), torch.zeros(bs * topk * steps, dtype=torch.int64)
    K.assign_draft_cache_locs_contiguous_cpu(rp, r2t, start, oa, pool_len, topk, steps)
    cache_locs.assign_draft_cache_locs_contiguous[(bs,)](rp, r2t, start, ob, pool_len, topk, steps)
    same("assign_draft_cache_locs_contiguous", bs, (oa,), (ob,))
    stride = steps + 1
    tokens = torch.randint(1000, (bs * stride,), generator=g)
    lens = torch.randint(1, stride + 1, (bs,), generator=g, dtype=torch.int32)
    oa, ob = torch.zeros(bs, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64)
    K.fill_bonus_tokens_cpu(tokens, lens, oa, stride)
    eagle.fill_bonus_tokens[(bs,)](tokens, lens, ob, stride)
    same("fill_bonus_tokens", bs, (oa,), (ob,))
    index = torch.where(torch.rand(bs * stride, generator=g) < 0.5, torch.arange(bs * stride), -1).int()
    out_locs = torch.randint(1000, (bs * stride,), generator=g)
    oa, ob = torch.full((bs * stride,), -7), torch.full((bs * stride,), -7)
    K.fill_accept_out_cache_loc_cpu(index, out_locs, oa)
    eagle.fill_accept_out_cache_loc[(bs * stride,)](index, out_locs, ob, 64)
    same("fill_accept_out_cache_loc", bs, (oa,), (ob,))


def check_kv_copy(g) -> None:
    """Against plain indexing: the Triton kernel takes raw addresses, which its interpreter cannot read."""
    bufs = [torch.randn(40, 3, 4, generator=g), torch.randn(40, 5, generator=g)]
    want = [b.clone() for b in bufs]
    src, tgt = torch.tensor([1, 2, 3, 9]), torch.tensor([2, 3, 30, 1])  # overlapping: every read before any write
    for w in want:
        w[tgt] = w[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs], dtype=torch.int64)
    K.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    same("copy_all_layer_kv_cache", "overlap", bufs, want)


def main() -> None:
    g = torch.Generator().manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for case in [(1, 1, 1), (3, 1, 2), (2, 1, 4), (2, 2, 3), (3, 4, 3), (1, 3, 5)]:
        for _ in range(3):
            check_tree(g, case)
    for bs in (1, 4, 7):
        check_cache_locs(g, bs)
    check_kv_copy(g)
    print(json.dumps(bad))


if __name__ == "__main__":
    main()
