"""How often the MTP draft's tokens are accepted: from counters, in theory, offline, and from SGLang. Pure math.

Definitions follow SGLang (`TokenizerManager._calculate_spec_decoding_metrics`), with k = `draft_len` = drafts
per verify step. That is SGLang's `speculative_num_steps` for a top-1 chain, NOT its `speculative_num_draft_tokens`,
which counts the verified token too (k + 1; `labkit.engine.config.SpeculativeConfig.num_draft_tokens`):
  accept_length = completion_tokens / verify_ct        tokens per target forward, bonus token included
  accept_rate   = correct_drafts / (verify_ct * k)      strict: drafts only, no bonus
  accept_rate_pos_i = P(draft i accepted | drafts < i accepted)
Across requests the counters are summed, never the per-request ratios averaged (long requests weigh more, as
they do in throughput).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from labkit.config import check


def _count(name: str, value: object) -> None:
    check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, name, value, "an integer >= 0")


def _k(value: object, name: str = "draft_len") -> None:
    check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value,
          "an integer >= 1 (k, drafts per verify step; SGLang's speculative_num_draft_tokens is k + 1)")


@dataclass(frozen=True, slots=True)
class Counters:
    """Speculative-decoding counters of one request or many (summed with `merge` / `Counters.total`).

    pos_accepted[i-1] / pos_proposed[i-1]: verify steps in which draft i was accepted / in which every draft
    before it was accepted, so its own fate decided the step. Empty when unknown (e.g. an engine without a
    histogram): the per-position rates are then left out.
    """

    k: int
    verify_ct: int = 0
    completion_tokens: int = 0
    correct_drafts: int = 0
    pos_accepted: tuple[int, ...] = ()
    pos_proposed: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _k(self.k, "k")
        for f in ("verify_ct", "completion_tokens", "correct_drafts"):
            _count(f, getattr(self, f))
        check(self.correct_drafts <= self.verify_ct * self.k, "correct_drafts", self.correct_drafts,
              f"at most verify_ct * k = {self.verify_ct * self.k}")
        check(self.completion_tokens >= self.verify_ct, "completion_tokens", self.completion_tokens,
              f">= verify_ct = {self.verify_ct} (every verify step emits a token)")
        check(len(self.pos_accepted) == len(self.pos_proposed) and len(self.pos_accepted) in (0, self.k),
              "per_position", list(zip(self.pos_accepted, self.pos_proposed)),
              f"{self.k} (accepted, proposed) pairs, one per draft position, or none")
        for i, (a, p) in enumerate(zip(self.pos_accepted, self.pos_proposed), start=1):
            _count(f"accepted_pos_{i}", a)
            _count(f"proposed_pos_{i}", p)
            check(a <= p, f"accepted_pos_{i}", a, f"at most proposed_pos_{i} = {p}")

    def merge(self, other: Counters) -> Counters:
        """Sum of both. Per-position counts survive only when both sides have them."""
        check(other.k == self.k, "k", other.k, f"the same drafts per step as the counters it is merged with ({self.k})")
        both = bool(self.pos_proposed) and bool(other.pos_proposed)
        return Counters(
            k=self.k, verify_ct=self.verify_ct + other.verify_ct,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            correct_drafts=self.correct_drafts + other.correct_drafts,
            pos_accepted=tuple(a + b for a, b in zip(self.pos_accepted, other.pos_accepted)) if both else (),
            pos_proposed=tuple(a + b for a, b in zip(self.pos_proposed, other.pos_proposed)) if both else ())

    @staticmethod
    def total(items: Iterable[Counters], k: int) -> Counters:
        out = Counters(k=k, pos_accepted=(0,) * k, pos_proposed=(0,) * k)
        for c in items:
            out = out.merge(c)
        return out

    def metrics(self) -> dict:
        per_position = list(zip(self.pos_accepted, self.pos_proposed)) or None
        return from_counters(self.verify_ct, self.completion_tokens, self.correct_drafts, self.k, per_position)


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan  # nothing was verified: the rate is undefined, not 0


def from_counters(verify_ct: int, completion_tokens: int, correct_drafts: int, draft_len: int,
                  per_position: Sequence[tuple[int, int]] | None = None) -> dict:
    """{mtp/accept_length, mtp/accept_rate, mtp/accept_rate_pos_{i} (when per_position is given), mtp/verify_ct}.

    draft_len: k, drafts per verify step (not SGLang's speculative_num_draft_tokens, which is k + 1).
    per_position: k pairs (accepted, proposed). Ratios over zero verify steps are NaN.
    """
    pairs = list(per_position or ())
    _k(draft_len)
    c = Counters(k=draft_len, verify_ct=verify_ct, completion_tokens=completion_tokens,
                 correct_drafts=correct_drafts, pos_accepted=tuple(a for a, _ in pairs),
                 pos_proposed=tuple(p for _, p in pairs))
    out = {"mtp/accept_length": _ratio(c.completion_tokens, c.verify_ct),
           "mtp/accept_rate": _ratio(c.correct_drafts, c.verify_ct * c.k)}
    for i, (a, p) in enumerate(pairs, start=1):
        out[f"mtp/accept_rate_pos_{i}"] = _ratio(a, p)
    out["mtp/verify_ct"] = c.verify_ct
    return out


def _rate(name: str, a: object) -> None:
    check(isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1, name, a, "a number in [0, 1]")


def expected_accept_length(a: float, k: int) -> float:
    """E[tokens per verify step] = sum_{j=0..k} a^j = (1 - a^(k+1)) / (1 - a), when each draft is accepted
    independently with probability a (the bonus token included, like accept_length)."""
    _rate("a", a)
    check(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", k, "an integer >= 1")
    return float(sum(a ** j for j in range(k + 1)))  # the closed form cancels catastrophically near a = 1


def rate_from_length(length: float, k: int) -> float:
    """The per-draft acceptance a whose expected_accept_length(a, k) is `length` (bisection; it is increasing)."""
    check(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", k, "an integer >= 1")
    check(isinstance(length, (int, float)) and not isinstance(length, bool) and 1 <= length <= k + 1,
          "length", length, f"a number in [1, k + 1 = {k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # 2^-60: below float resolution
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_accept_length(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def overlap(logits, mtp_logits, temperature: float):
    """[b, s-2]: at position i, sum_x min(p, q) for the token i+2 (T > 0) or [argmax p == argmax q] (T = 0).

    The MTP head at position i drafts token i+2 (q = softmax(mtp_logits[:, i] / T)); the target's distribution
    for that same token is p = softmax(logits[:, i+1] / T). sum_x min(p, q) = 1 - TV(p, q) is the probability
    that speculative sampling accepts a draft from q.
    """
    import torch

    check(isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature >= 0,
          "temperature", temperature, "a number >= 0")
    check(logits.dim() == 3, "logits.shape", tuple(logits.shape), "[batch, seq, vocab]")
    check(tuple(mtp_logits.shape) == tuple(logits.shape), "mtp_logits.shape", tuple(mtp_logits.shape),
          f"the shape of logits {tuple(logits.shape)}")
    n = max(0, logits.shape[1] - 2)
    q_logits, p_logits = mtp_logits[:, :n].float(), logits[:, 1:n + 1].float()
    if temperature == 0:
        return (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    p, q = torch.softmax(p_logits / temperature, -1), torch.softmax(q_logits / temperature, -1)
    return torch.minimum(p, q).sum(-1)


def offline_accept_rate(logits, mtp_logits, mask, temperature: float) -> tuple[float, int]:
    """Offline estimate of a from ONE teacher-forced forward: (E_t[sum_x min(p_t(x), q_t(x))], positions counted).

    logits, mtp_logits: [b, s, V] main and first-MTP-head logits; mask: [b, s], 1 on the tokens that count
    (the response); see `overlap` for the alignment. Only the first draft of the chain is estimated (later ones
    read the MTP head's own hidden state). Every counted position weighs the same; `offline_loop_rate` weighs
    them as a speculative loop visits them. Returns (NaN, 0) when no position counts.
    """
    check(tuple(mask.shape) == tuple(logits.shape[:2]), "mask.shape", tuple(mask.shape),
          f"[batch, seq] = {tuple(logits.shape[:2])}")
    ov = overlap(logits, mtp_logits, temperature)
    counted = mask[:, 2:].bool()
    count = int(counted.sum())
    return (float(ov[counted].mean()) if count else math.nan), count


ENTROPY_EDGES = (0.05, 0.5, 1.0)  # nats: near-certain target tokens, uncertain ones, and the noisy digits between


def by_entropy(logits, mtp_logits, mask, temperature: float, edges: Sequence[float] = ENTROPY_EDGES) -> dict:
    """The offline acceptance split by the target's entropy at the drafted token (nats, of p at `temperature`):
    {"<0.05": [rate, count], "0.05-0.5": ..., ">=1.0": ...}; bins without a position get [None, 0]. Where the
    target is nearly certain any draft that learned the trunk agrees; the uncertain tokens are where drafts differ.
    Every counted position weighs the same: the bins pool to `offline_accept_rate` (the `_plain` metric), not to
    the loop-weighted `offline_loop_rate`."""
    import torch

    ov = overlap(logits, mtp_logits, temperature)
    n = ov.shape[1]
    p = torch.softmax(logits[:, 1:n + 1].float() / max(temperature, 1e-6), -1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    counted = mask[:, 2:].bool()
    bounds = [-math.inf, *edges, math.inf]
    out = {}
    for lo, hi in zip(bounds, bounds[1:]):
        name = f"<{hi:g}" if lo == -math.inf else (f">={lo:g}" if hi == math.inf else f"{lo:g}-{hi:g}")
        sel = counted & (ent >= lo) & (ent < hi)
        c = int(sel.sum())
        out[name] = [float(ov[sel].mean()) if c else None, c]
    return out


def round_starts(a: Sequence[float], k: int) -> list[float]:
    """P(a verify round starts at response token j) for j = 1..len(a), given each token's acceptance a[j-1].

    Token 0 comes from the prefill; a round starting at j drafts tokens j..j+k-1 and, after n accepted
    drafts, emits one target token, so the next round starts at j+n+1. Drafts past the end are not proposed.
    """
    _k(k)
    n = len(a)
    start = [0.0] * (n + k + 2)
    if n:
        start[1] = 1.0  # a[0] is the first drafted token's acceptance (response token 1)
    for j in range(1, n + 1):
        if not start[j]:
            continue
        reach = 1.0  # P(the first i drafts were accepted)
        for i in range(k + 1):
            t = j + i  # draft i+1 proposes token t
            stop = 1.0 - a[t - 1] if i < k and t <= n else 1.0  # rejected, or nothing left to draft
            start[t + 1] += start[j] * reach * stop
            if i == k or t > n:
                break
            reach *= a[t - 1]
    return start[1:n + 1]


def offline_loop_rate(logits, mtp_logits, prompt_lens: Sequence[int], completion_lens: Sequence[int],
                      temperature: float, k: int = 1) -> tuple[float, float]:
    """The depth-1 acceptance a speculative loop would measure, estimated from one teacher-forced forward.

    A loop does not draft every token: after an accepted draft the target emits the next one, so positions
    that follow easy ones are drafted less often (with k = 1 and "82</s>", the easy </s> is drafted only when
    the "2" was rejected). Each position's sum_x min(p, q) is weighed by the probability that a round starts
    there (`round_starts`, drafts accepted independently). Returns (rate, expected depth-1 drafts).
    """
    ov = overlap(logits, mtp_logits, temperature)
    num = den = 0.0
    for b, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        # response token j (j >= 1) sits at index p + j; its overlap is at position p + j - 2
        a = [float(ov[b, p + j - 2]) for j in range(1, c)]
        w = round_starts(a, k)
        num += sum(wi * ai for wi, ai in zip(w, a))
        den += sum(w)
    return (num / den if den else math.nan), den


def _positions_from_histogram(hist: Sequence[int], k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """SGLang's histogram (hist[n] = verify steps with n correct drafts) -> per-position (accepted, proposed)."""
    check(len(hist) <= k + 1, "spec_correct_drafts_histogram", list(hist), f"at most k + 1 = {k + 1} bins")
    at_least = [sum(hist[n:]) for n in range(k + 1)]  # steps with >= n correct drafts
    return tuple(at_least[1:]), tuple(at_least[:-1])


def parse_sglang_meta(meta_infos: Sequence[dict], draft_len: int) -> dict:
    """The `from_counters` dict from SGLang's per-request meta_info (summed over requests).

    Reads spec_verify_ct, completion_tokens, spec_num_correct_drafts (or spec_accept_rate), and
    spec_correct_drafts_histogram for the per-position rates when every verified request has one. Requests
    without spec_verify_ct (SGLang drops the keys when a request finished at prefill) add their tokens only.
    """
    _k(draft_len)
    k, total, any_verified = draft_len, None, False
    for i, m in enumerate(meta_infos):
        _count(f"meta_infos[{i}]['completion_tokens']", m.get("completion_tokens"))
        ct = m.get("spec_verify_ct", 0)
        _count(f"meta_infos[{i}]['spec_verify_ct']", ct)
        proposed = m.get("spec_num_proposed_drafts")
        check(proposed is None or proposed == ct * k, "draft_len", k,
              f"the engine's drafts per step: meta_infos[{i}] has spec_num_proposed_drafts={proposed} over "
              f"spec_verify_ct={ct} (pass draft_len = speculative_num_steps = speculative_num_draft_tokens - 1)")
        if "spec_num_correct_drafts" in m:
            correct = m["spec_num_correct_drafts"]
        elif "spec_accept_rate" in m:
            correct = round(m["spec_accept_rate"] * ct * k)
        else:
            check(ct == 0, f"meta_infos[{i}]", sorted(m), "spec_num_correct_drafts or spec_accept_rate with "
                  "spec_verify_ct")
            correct = 0
        hist = m.get("spec_correct_drafts_histogram")
        acc, prop = _positions_from_histogram(hist, k) if hist else ((), ())
        c = Counters(k=k, verify_ct=ct, completion_tokens=m["completion_tokens"], correct_drafts=correct,
                     pos_accepted=acc, pos_proposed=prop)
        if ct == 0:  # no histogram to expect: keep the running per-position counts
            c = Counters(k=k, completion_tokens=c.completion_tokens, pos_accepted=(0,) * k, pos_proposed=(0,) * k)
        any_verified |= ct > 0
        total = c if total is None else total.merge(c)
    check(any_verified, "meta_infos", f"<{len(meta_infos)} requests without spec_verify_ct>",
          "at least one request with spec_verify_ct > 0 (is the engine started with a speculative_algorithm?)")
    return total.metrics()
