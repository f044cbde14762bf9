"""Acceptance by position within a generation: drafts proposed and accepted per output position, pooled over
requests into bins of `width` tokens (`mtp/accept_rate_at_{lo}_{hi}`).

Why: RL rollouts run to thousands of tokens and a draft's acceptance need not be flat along one (it falls where
the policy's states drift from those the draft was trained on, and where errors compound: Test-Time
Speculation, arXiv 2605.09329); one number over a whole generation hides that. Position p is the 0-based index
of the drafted token in the completion (the first generated token, which no draft proposes, is position 0).
Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from labkit.config import check

WIDTH = 32
"""Tokens per bin."""


def key(lo: int, hi: int) -> str:
    return f"mtp/accept_rate_at_{lo}_{hi}"


def binned(accepted_at: Sequence[int], proposed_at: Sequence[int], width: int = WIDTH,
           limit: int | None = None) -> dict:
    """{mtp/accept_rate_at_{lo}_{hi}: accepted / proposed in [lo, hi]} per bin of `width` positions up to `limit`
    (default: the arrays' length); NaN where nothing was proposed. `accepted_at[p]` <= `proposed_at[p]`: the
    drafts for position p accepted / whose fate was decided."""
    check(len(accepted_at) == len(proposed_at), "accepted_at", len(accepted_at),
          f"as many positions as proposed_at ({len(proposed_at)})")
    check(isinstance(width, int) and width >= 1, "width", width, "an integer >= 1")
    for p, (a, n) in enumerate(zip(accepted_at, proposed_at)):
        check(0 <= a <= n, f"accepted_at[{p}]", a, f"an integer in [0, proposed_at[{p}] = {n}]")
    limit = len(proposed_at) if limit is None else limit
    out = {}
    for lo in range(0, limit, width):
        hi = min(lo + width, limit) - 1
        a, n = sum(accepted_at[lo:hi + 1]), sum(proposed_at[lo:hi + 1])
        out[key(lo, hi)] = a / n if n else math.nan
    return out


def bin_keys(row: dict) -> list[str]:
    """The by-position keys of a metrics row, in position order."""
    keys = [k for k in row if k.startswith("mtp/accept_rate_at_")]
    return sorted(keys, key=lambda k: int(k.removeprefix("mtp/accept_rate_at_").split("_")[0]))


def summary_bins(m: dict, arm: str) -> tuple[str, list[str]]:
    """(key prefix, bin names "lo_hi" in position order) of the by-position keys an MTP experiment's summary holds
    for `arm`: labkit's loop beside the engine (`mtp/final_loop_accept_rate_at_`) where there is one, else the
    run's own instrument (`mtp/final_accept_rate_at_`)."""
    loop = "mtp/final_loop_accept_rate_at_"
    prefix = loop if any(k.startswith(loop) for k in m) else "mtp/final_accept_rate_at_"
    names = [k.removeprefix(prefix).removesuffix(f"_{arm}_mean") for k in m
             if k.startswith(prefix) and k.endswith(f"_{arm}_mean")]
    return prefix, sorted(names, key=lambda b: int(b.split("_")[0]))
