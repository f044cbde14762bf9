"""Time one MoE bucket's apply as one copy per tensor (`torch._foreach_copy_`, labkit's apply before
labkit.engine.inside.copyruns) against every progression merged into strided copies, on CPU or CUDA, and says how many
copies labkit's plan makes there (`copies_in_labkit_plan`: on a GPU large pieces stay apart); prints one JSON line.

    python scripts/copyruns_bench.py [--device cuda] [--experts 128 --inter 768 --hidden 2048 --dtype bfloat16]
                                     [--out F]

The default shape is one layer of Qwen3-30B-A3B's experts (128 x gate/up/down of 768 x 2048, bf16: 1.2 GB, 384
tensors); both ways are checked bitwise against each other before they are timed."""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.engine.inside import apply
from labkit.engine.inside import copyplan  # noqa: E402
from labkit import provenance  # noqa: E402


class Experts(nn.Module):
    """One MoE layer's experts as SGLang's FusedMoE holds them (w13 [E, 2I, H], w2 [E, H, I]), answering
    `param_view` for HF-like names `gate.<e>`, `up.<e>`, `down.<e>` as labkit's models do."""

    def __init__(self, experts: int, inter: int, hidden: int, dtype: torch.dtype, device: str):
        super().__init__()
        self.i = inter
        self.w13 = nn.Parameter(torch.zeros(experts, 2 * inter, hidden, dtype=dtype, device=device), False)
        self.w2 = nn.Parameter(torch.zeros(experts, hidden, inter, dtype=dtype, device=device), False)

    def param_view(self, name: str):
        kind, _, e = name.partition(".")
        if kind == "down":
            return "w2", self.w2.data[int(e)]
        return "w13", self.w13.data[int(e)].narrow(0, 0 if kind == "gate" else self.i, self.i)


def _bucket(m: Experts) -> tuple[str, torch.Tensor]:
    """(layout key, flat uint8 bucket) of every expert's gate, up and down, random, in plan order."""
    g, entries, parts, off = torch.Generator().manual_seed(0), [], [], 0
    for e in range(m.w13.shape[0]):
        for kind in ("gate", "up", "down"):
            name = f"{kind}.{e}"
            t = torch.randn(tuple(m.param_view(name)[1].shape), generator=g).to(m.w13.device, m.w13.dtype)
            raw = t.view(-1).view(torch.uint8)
            entries.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), off, off + raw.numel()))
            parts.append(raw)
            off += raw.numel()
    return apply.layout_key(entries), torch.cat(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="Also write the result to this JSON file (a stored run).")
    a = ap.parse_args()
    m = Experts(a.experts, a.inter, a.hidden, getattr(torch, a.dtype), a.device)
    key, flat = _bucket(m)
    in_plan = len(copyplan.plan_for(m, key).runs)  # what labkit's plan does here (on a GPU: GPU_MERGE_BELOW)
    copyplan.GPU_MERGE_BELOW = float("inf")  # time every progression merged
    copyplan._plans.clear()
    plan = copyplan.plan_for(m, key)
    srcs = [flat[s:e].view(getattr(torch, d)).view(sh) for _, d, sh, s, e in plan.entries]
    per_tensor = [srcs[i] for i in plan.direct]
    merged = copyplan.run_sources(plan, srcs)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def timed(dsts, sources) -> float:
        torch._foreach_copy_(dsts, sources)  # warm-up
        sync()
        best = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            torch._foreach_copy_(dsts, sources)
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    t_merged = timed(plan.run_dsts, merged)
    after_merged = [p.clone() for p in m.parameters()]
    for p in m.parameters():
        p.zero_()
    t_per = timed(plan.dsts, per_tensor)
    same = all(torch.equal(x, y) for x, y in zip(after_merged, m.parameters()))
    nbytes = flat.numel()
    record = {
        "command": "python scripts/copyruns_bench.py " + " ".join(sys.argv[1:]),
        "provenance": provenance.collect(config=vars(a)),
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "tensors": len(plan.entries), "copies_merged": len(plan.runs), "copies_in_labkit_plan": in_plan,
        "bytes": nbytes,
        "per_tensor_s": round(t_per, 6), "merged_s": round(t_merged, 6),
        "per_tensor_gbps": round(nbytes / t_per / 1e9, 2), "merged_gbps": round(nbytes / t_merged / 1e9, 2),
        "bitwise_equal": same}
    print(json.dumps(record))
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
