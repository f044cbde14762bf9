"""Torch versions of the `sgl_kernel.*_cpu` ops SGLang 0.5.23's EAGLE/NEXTN worker calls on a CPU engine.

SGLang's CPU lane for speculative decoding calls these C++ ops (the CPU build of sgl_kernel, source-only); labkit's
placeholder (`labkit/compat/sglang_cpu/sgl_kernel`) serves them from here instead. Each one follows the Triton kernel
SGLang runs on GPU for the same job (named in its docstring), argument for argument, and
`tests/unit/test_spec_kernels.py` checks each against that Triton kernel run by Triton's interpreter. Speed is not a
goal: a request's tree has a handful of tokens, and the loops below run once per request per verify step.

Where each is called (paths under sglang/): `copy_all_layer_kv_cache_cpu` at KV-pool warm-up whenever speculative
decoding is on (the first error at engine start without it), `assign_req_to_token_pool_cpu` in
`alloc_for_spec_decode` every step, `assign_draft_cache_locs_contiguous_cpu` before the draft, the tree build and
greedy verify after it, `assign_extend_cache_locs_cpu` for the verify's cache slots, `fill_bonus_tokens_cpu` after
the verify, `fill_accept_out_cache_loc_cpu` for top-k > 1 trees.
"""

from __future__ import annotations

import ctypes

import torch

QLEN_ONLY, FULL_MASK = 1, 0  # sglang.kernels.ops.speculative.spec_tree.TreeMaskMode


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """Per KV buffer (base address, row bytes): row tgt_loc[i] = row src_loc[i], every source read before any
    write (`copy_all_layer_kv_cache_tiled`: "safe for in-place copy")."""
    if tgt_loc.numel() == 0:
        return
    rows = int(torch.maximum(tgt_loc.max(), src_loc.max())) + 1
    tgt, src = tgt_loc.long(), src_loc.long()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(base)
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        buf[tgt] = buf[src]  # advanced indexing gathers first


def _spans(start: torch.Tensor, end: torch.Tensor):
    out = 0
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        yield i, s, e, out
        out += e - s


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """`assign_req_to_token_pool`: request i's slots [start, end) in its row take the next end - start entries of
    out_cache_loc (packed request after request)."""
    for i, s, e, out in _spans(start_offset, end_offset):
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[out:out + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """`assign_extend_cache_locs`: the reverse of the above, row slots [start, end) packed into out_cache_loc."""
    for i, s, e, out in _spans(start_offset, end_offset):
        out_cache_loc[out:out + e - s] = req_to_token[int(req_pool_indices[i]), s:e].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len: int,
                                           topk: int, num_steps: int) -> None:
    """`assign_draft_cache_locs_contiguous`: request i's topk * num_steps slots from seq_lens[i] on."""
    n = topk * num_steps
    out = out_cache_loc.view(-1)
    for i, s in enumerate(seq_lens.tolist()):
        out[i * n:(i + 1) * n] = req_to_token[int(req_pool_indices[i]), s:s + n].to(out.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride: int) -> None:
    """`fill_bonus_tokens`: request i's last accepted token (its accept_lens count the bonus token)."""
    idx = torch.arange(accept_lens.numel()) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """`fill_accept_out_cache_loc`: the cache slots of the accepted entries (accept_index != -1), packed."""
    idx = accept_index.reshape(-1)
    kept = idx[idx != -1].long()
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def _parent_slot(sel: list[int], parents: list[int], cur: int, topk: int) -> int | None:
    """The tree slot (1-based; 0 is the root) of draft `cur`'s parent, None where it is not in the tree."""
    parent_tb = sel[cur] // topk
    if parent_tb == 0:
        return 0
    token = parents[parent_tb]
    return next((pp + 1 for pp in range(len(sel)) if sel[pp] == token), None)


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrieve_index, retrieve_next_token, retrieve_next_sibling, topk: int, depth: int,
                                    draft_token_num: int, tree_mask_mode: int) -> None:
    """`sgl_build_tree_kernel_efficient_triton` (FULL_MASK and QLEN_ONLY): per request, the retrieve links
    (first child / next sibling), each draft's position and the tree mask (a draft sees its ancestors)."""
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(f"labkit spec_cpu: tree_mask_mode={tree_mask_mode} (bit-packed) has no torch port")
    n, mask = draft_token_num, tree_mask.view(-1)
    seq_lens = verified_seq_len.tolist()
    prefix = 0
    for b, seq_len in enumerate(seq_lens):
        sel = selected_index[b].tolist()[:n - 1]
        parents = parent_list[b].tolist() if parent_list.dim() > 1 else parent_list.tolist()
        base = b * n
        positions[base] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = base + i
            slot = _parent_slot(sel, parents, i - 1, topk)
            if slot is not None:
                nxt = int(retrieve_next_token[b, slot])
                retrieve_next_token[b, slot] = i
                if nxt != -1:
                    retrieve_next_sibling[b, i] = nxt
        retrieve_index[b, 0] = base
        for x in range(n):
            if tree_mask_mode == FULL_MASK:
                row = n * n * b + prefix * n + (seq_len + n) * x + seq_len + 1
            else:
                row = n * n * b + n * x + 1
            mask[row - 1] = True
            mask[row:row + n - 1] = False
            if x == 0:
                continue
            cur, position = x - 1, 0
            for _ in range(depth):
                position += 1
                mask[row + cur] = True
                slot = _parent_slot(sel, parents, cur, topk)
                if not slot:  # the root (0) or not found
                    break
                cur = slot - 1
            positions[base + x] = position + seq_len
        prefix += seq_len


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, target_predict) -> None:
    """`verify_tree_greedy_kernel_triton`: walk each request's tree from the root, at every level taking the
    child whose draft equals the target's argmax there; the target's token after the last match is the bonus."""
    spec = accept_index.shape[1]
    tgt = target_predict.reshape(-1).tolist()
    for b in range(candidates.shape[0]):
        cand, ridx = candidates[b].tolist(), retrive_index[b].tolist()
        nxt, sib = retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist()
        last = ridx[0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, spec):
            cur = nxt[cur]
            while cur != -1 and cand[cur] != tgt[last]:
                cur = sib[cur]
            if cur == -1:
                break
            predicts[last] = tgt[last]
            accepted += 1
            accept_index[b, accepted] = ridx[cur]
            last = ridx[cur]
        accept_token_num[b] = accepted
        predicts[last] = tgt[last]


KERNELS = {f.__name__: f for f in (
    copy_all_layer_kv_cache_cpu, assign_req_to_token_pool_cpu, assign_extend_cache_locs_cpu,
    assign_draft_cache_locs_contiguous_cpu, fill_bonus_tokens_cpu, fill_accept_out_cache_loc_cpu,
    build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu)}
