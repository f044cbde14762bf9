"""labkit's own speculative decoding with the MTP draft, over exported HF-named weights (what the engine serves).

One round, as SGLang's NEXTN/EAGLE worker with top-k 1: with accepted tokens t_0..t_m and the target's hidden
states h_i (post final norm) known for i < m,
  draft 1   the MTP layer over positions 0..m-1 with inputs (h_i, embed(t_{i+1})), read at position m-1;
  draft j>1 one more position whose inputs are (the MTP layer's output at the previous position, d_{j-1}).
            That output is taken after the MTP block's final_layernorm: SGLang's MiMoMTP returns it normed, the
            logits processor stores it, and EAGLE's draft_forward feeds `logits_output.hidden_states` back;
  verify    one target forward over t_0..t_m, d_1..d_k: greedy keeps drafts while they equal the target's argmax,
            T > 0 runs speculative rejection sampling; then one more target token (correction or bonus).
The first generated token comes from the prefill, not from a verify step, as in SGLang. Counters count only
emitted tokens (a round cut by EOS or max_new_tokens counts the drafts it emitted).

Depth j uses MTP layer j-1 when the model has several, the last one beyond (MiMo ships one layer and SGLang's
MiMoMTP holds one). The draft's inputs (`draft_inputs`): "trainer" runs the draft exactly as the trainer computes
it (ReferenceModel, Megatron); "sglang" zeroes the token embedding at position 0, as SGLang's MiMoMTP (and vLLM's)
does (`models/mimo_mtp.py:58`). Position 0 reaches every later position through attention, so every depth can
differ; with SGLang's inputs this loop measures what SGLang's draft worker drafts.
Rows are batched right-padded: causal attention makes position i independent of the padding after it, so no
mask is needed, and every round recomputes the whole (short) sequence instead of keeping a KV cache.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, get_args

import torch

from labkit.config import check
from labkit.models.hf import ReferenceModel, read_config_json
from labkit.models.tokenizer import EOS, PAD
from labkit.mtp import positions
from labkit.mtp.acceptance import Counters

_DRAFT_SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # what the MTP draft reads besides its layers
DraftInputs = Literal["trainer", "sglang"]
DRAFT_INPUTS: tuple[str, ...] = get_args(DraftInputs)
Counts = Literal["emitted", "verified"]
COUNTS: tuple[str, ...] = get_args(Counts)


def check_choice_of(draft_inputs: str) -> None:
    check(draft_inputs in DRAFT_INPUTS, "draft_inputs", draft_inputs, f"one of {DRAFT_INPUTS}")


def verify_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits [B, k+1, V] (the target's logits for draft positions 1..k, then the bonus), drafts [B, k]
    -> (accepted drafts [B], next token [B]): drafts are kept while they equal the target's argmax."""
    choice = target_logits.argmax(-1)
    accepted = (choice[:, :-1] == drafts).long().cumprod(1).sum(1)
    return accepted, choice.gather(1, accepted[:, None])[:, 0]


def verify_sampled(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    p [B, k+1, V]: target probabilities; q [B, k, V]: the draft probabilities d_j was drawn from. Draft j is
    kept with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the next token is drawn from
    normalize(max(p_j - q_j, 0)), after k acceptances from p_{k+1}. Every emitted token is then distributed
    exactly as the target's. Returns (accepted drafts [B], next token [B]).
    """
    b, k = drafts.shape
    pd = p[:, :k].gather(2, drafts[..., None])[..., 0]
    qd = q.gather(2, drafts[..., None])[..., 0]
    u = torch.rand(b, k, generator=generator, device=p.device)
    accepted = (u * qd < pd).long().cumprod(1).sum(1)  # u < p/q without dividing
    at = accepted[:, None, None].expand(-1, 1, p.shape[-1])
    pj = p.gather(1, at)[:, 0]
    qj = torch.cat([q, torch.zeros_like(q[:, :1])], 1).gather(1, at)[:, 0]  # q = 0 at the bonus: sample p
    residual = (pj - qj).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), pj)  # p == q: rejection had probability 0
    return accepted, torch.multinomial(residual, 1, generator=generator)[:, 0]


@contextmanager
def _one_thread(device: torch.device):
    """The tensors here are tiny: on CPU, intra-op threads only add synchronization (measured 10x slower for 256
    prompts on a loaded 2-core CPU), so decoding runs on one thread and restores the setting after."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy (T = 0, no probabilities) or a sample from softmax(logits / T) with its probabilities."""
    if temperature == 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits / temperature, -1)
    return torch.multinomial(probs, 1, generator=gen)[:, 0], probs


class Speculator:
    """Target = trunk + lm_head of `weights`; draft = the MTP layer(s) with the embedding and lm_head it reads.

    The draft shares the target's tensors (as SGLang shares embed/head with the MTP draft) unless
    `draft_weights` is given: its MTP layers and embedding/lm_head then replace the draft's (an engine whose
    draft was not synced); its other tensors are ignored. weights=None reads the checkpoint in model_dir.
    `draft_inputs`: "trainer" (the default: the draft as the trainer computes it) or "sglang" (position 0's token
    embedding zeroed, as SGLang's draft model runs it; the module docstring says where they part).
    """

    def __init__(self, model_dir: str | Path, weights: dict | None = None, draft_weights: dict | None = None,
                 device: str = "cpu", draft_inputs: DraftInputs = "trainer"):
        from safetensors.torch import load_file

        check_choice_of(draft_inputs)
        self.zero_first = draft_inputs == "sglang"

        cfg = read_config_json(model_dir)
        self.num_mtp = int(cfg.get("num_nextn_predict_layers", 0))
        check(self.num_mtp >= 1, "num_nextn_predict_layers", self.num_mtp,
              f">= 1 in {Path(model_dir) / 'config.json'}: speculative decoding drafts with an MTP layer")
        weights = dict(weights) if weights is not None else load_file(str(Path(model_dir) / "model.safetensors"))
        check(any(n.startswith("model.mtp_layers.") for n in weights), "weights", f"<{len(weights)} tensors>",
              "the MTP layers too (model.mtp_layers.{i}.*)")
        self.device = torch.device(device)
        self.target = ReferenceModel(model_dir, weights).to(self.device)
        self.draft = self.target
        if draft_weights is not None:
            own = {n: t for n, t in dict(draft_weights).items()
                   if n.startswith("model.mtp_layers.") or n in _DRAFT_SHARED}
            check(any(n.startswith("model.mtp_layers.") for n in own), "draft_weights",
                  f"<{len(draft_weights)} tensors>", "HF-named MTP tensors (model.mtp_layers.{i}.*)")
            self.draft = ReferenceModel(model_dir, {**weights, **own}).to(self.device)
        self.vocab = self.target.config.vocab_size
        self.max_positions = self.target.config.max_position_embeddings

    def _check(self, prompts: list[list[int]], temperature: float, max_new_tokens: int, k: int = 1) -> None:
        check(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", k, "an integer >= 1 (drafts per step)")
        check(isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature >= 0,
              "temperature", temperature, "a number >= 0 (0 = greedy)")
        check(isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens >= 1,
              "max_new_tokens", max_new_tokens, "an integer >= 1")
        check(isinstance(prompts, list) and len(prompts) > 0, "prompts", prompts, "a non-empty list of token-id lists")
        for i, p in enumerate(prompts):
            check(len(p) > 0 and all(isinstance(t, int) and 0 <= t < self.vocab for t in p), f"prompts[{i}]", p,
                  f"a non-empty list of token ids in [0, {self.vocab})")
        longest = max(len(p) for p in prompts) + max_new_tokens + k
        check(longest <= self.max_positions, "max_new_tokens", max_new_tokens,
              f"prompt + max_new_tokens + k <= max_position_embeddings = {self.max_positions}")

    def _start(self, prompts: list[list[int]], extra: int) -> tuple[torch.Tensor, torch.Tensor]:
        lens = torch.tensor([len(p) for p in prompts], device=self.device)
        seq = torch.full((len(prompts), int(lens.max()) + extra), PAD, dtype=torch.long, device=self.device)
        for r, p in enumerate(prompts):
            seq[r, :len(p)] = torch.tensor(p)
        return seq, lens

    def target_generate(self, prompts: list[list[int]], temperature: float, max_new_tokens: int, seed: int = 0,
                        eos_id: int = EOS, progress: bool = True) -> dict:
        """Plain decoding with the target alone (greedy at T = 0): {"requests": [{output_ids, completion_tokens}]}."""
        from tqdm.auto import tqdm

        self._check(prompts, temperature, max_new_tokens)
        gen = torch.Generator(self.device).manual_seed(seed)
        seq, lens = self._start(prompts, max_new_tokens)
        n, done = lens.clone(), torch.zeros(len(prompts), dtype=torch.bool, device=self.device)
        with _one_thread(self.device), tqdm(total=len(prompts), desc="target decode",
                                            disable=not progress or len(prompts) < 64) as bar:
            for step in range(max_new_tokens):
                a = (~done).nonzero()[:, 0]
                logits, _ = self.target.trunk_forward(seq[a, :int(n[a].max())])
                tok, _ = _pick(logits[torch.arange(len(a), device=self.device), n[a] - 1], temperature, gen)
                seq[a, n[a]] = tok
                n[a] += 1
                done[a] = (tok == eos_id) | (step + 1 == max_new_tokens)
                bar.update(int(done[a].sum()))
                if done.all():
                    break
        return {"requests": [{"output_ids": seq[r, lens[r]:n[r]].tolist(), "completion_tokens": int(n[r] - lens[r])}
                             for r in range(len(prompts))]}

    def _draft(self, seq: torch.Tensor, hid: torch.Tensor, n: torch.Tensor, k: int, temperature: float,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k chained MTP drafts per row: tokens [A, k] and, at T > 0, the draft probabilities [A, k, V]."""
        m, rows = n - 1, torch.arange(len(n), device=self.device)
        width = int(m.max()) + k - 1
        hin, tin = hid[:, :width].clone(), seq[:, 1:width + 1].clone()  # pairs (h_i, t_{i+1})
        drafts, probs, out = [], [], None
        for j in range(k):
            at = m - 1 + j  # the position depth j+1 reads
            if j:  # EAGLE chain: the new position pairs the draft's own hidden with its previous token
                hin[rows, at], tin[rows, at] = out, drafts[-1]
            w = int(at.max()) + 1
            logits, hidden = self.draft.mtp_forward(min(j, self.num_mtp - 1), hin[:, :w], tin[:, :w],
                                                    zero_first=self.zero_first)
            tok, pr = _pick(logits[rows, at], temperature, gen)
            out = hidden[rows, at]
            drafts.append(tok)
            probs.append(pr)
        return torch.stack(drafts, 1), (torch.stack(probs, 1) if temperature > 0 else None)

    def generate(self, prompts: list[list[int]], k: int, temperature: float, max_new_tokens: int, seed: int = 0,
                 eos_id: int = EOS, progress: bool = True, counts: Counts = "emitted") -> dict:
        """Speculative decoding with the MTP draft, k drafts per verify step (`draft_len` in labkit.mtp.acceptance;
        SGLang's speculative_num_steps, not its speculative_num_draft_tokens = k + 1). `counts`: "emitted" counts
        the drafts a round emitted (a round cut by EOS or the token budget counts fewer); "verified" every draft
        the verify step accepted, as SGLang's counters do (its request then ends at the cut all the same).

        Returns {"requests": [per request: output_ids, completion_tokens and SGLang's spec_* counters],
        "metrics": {mtp/accept_length, mtp/accept_rate, mtp/accept_rate_pos_{i}, mtp/verify_ct and by output
        position mtp/accept_rate_at_{lo}_{hi}} over all, "positions": {"accepted_at", "proposed_at"}: drafts
        per output position over all requests (labkit.mtp.positions)}.
        """
        self._check(prompts, temperature, max_new_tokens, k)
        check(counts in COUNTS, "counts", counts, f"one of {COUNTS}")
        with _one_thread(self.device):
            return self._speculate(prompts, k, temperature, max_new_tokens, seed, eos_id, progress,
                                   counts == "verified")

    def _speculate(self, prompts: list[list[int]], k: int, temperature: float, max_new_tokens: int, seed: int,
                   eos_id: int, progress: bool, all_verified: bool = False) -> dict:
        from tqdm.auto import tqdm

        dev, b = self.device, len(prompts)
        gen = torch.Generator(dev).manual_seed(seed)
        seq, lens = self._start(prompts, max_new_tokens + k + 1)
        # prefill: the first token is the target's alone (no verify step), as in SGLang
        logits, h = self.target.trunk_forward(seq[:, :int(lens.max())])
        hid = torch.zeros(b, seq.shape[1], h.shape[-1], device=dev)
        hid[:, :h.shape[1]] = h
        first, _ = _pick(logits[torch.arange(b, device=dev), lens - 1], temperature, gen)
        seq[torch.arange(b, device=dev), lens] = first
        n, emitted = lens + 1, torch.ones(b, dtype=torch.long, device=dev)
        done = (first == eos_id) | (max_new_tokens == 1)
        verify_ct, correct = torch.zeros_like(emitted), torch.zeros_like(emitted)
        pos_acc = torch.zeros(b, k, dtype=torch.long, device=dev)
        pos_prop = torch.zeros_like(pos_acc)
        hist = torch.zeros(b, k + 1, dtype=torch.long, device=dev)
        col = torch.arange(k + 1, device=dev)
        span = max_new_tokens + k  # output positions a draft can be proposed for ("verified": past the budget)
        at_acc = torch.zeros(b, span, dtype=torch.long, device=dev)  # by output position (labkit.mtp.positions)
        at_prop = torch.zeros_like(at_acc)
        with tqdm(total=b, desc=f"speculative decode (k={k})", disable=not progress or b < 64) as bar:
            bar.update(int(done.sum()))
            while not done.all():
                a = (~done).nonzero()[:, 0]
                sa, na = seq[a], n[a]
                drafts, q = self._draft(sa, hid[a], na, k, temperature, gen)
                width = int(na.max()) + k
                vt = sa[:, :width].scatter(1, na[:, None] + col[:k], drafts)
                logits, h = self.target.trunk_forward(vt)
                tl = logits.gather(1, (na[:, None] - 1 + col)[..., None].expand(-1, -1, logits.shape[-1]))
                if temperature == 0:
                    acc, nxt = verify_greedy(tl, drafts)
                else:
                    acc, nxt = verify_sampled(torch.softmax(tl / temperature, -1), q, drafts, gen)
                # emitted this round: d_1..d_acc then nxt, cut at the first EOS and at the token budget
                tokens = torch.cat([drafts, nxt[:, None]], 1).scatter(1, acc[:, None], nxt[:, None])
                eos = (tokens == eos_id) & (col <= acc[:, None])
                first_eos = torch.where(eos.any(1), eos.long().argmax(1), k + 1)
                n_emit = torch.minimum(torch.minimum(acc + 1, max_new_tokens - emitted[a]), first_eos + 1)
                counted = acc if all_verified else torch.minimum(acc, n_emit)
                seen = counted + 1 if all_verified else torch.minimum(counted + 1, n_emit)
                sa.scatter_(1, na[:, None] + col, tokens)  # past n_emit: junk, never read (causal)
                seq[a] = sa
                hid[a, :width] = h  # valid below the new last token: its prefix was all accepted
                n[a] += n_emit
                at = (emitted[a][:, None] + col[:k]).clamp(max=span - 1)  # draft j is for output position e + j - 1
                emitted[a] += n_emit
                verify_ct[a] += 1
                correct[a] += counted
                # position j's fate is known when drafts < j were emitted and accepted and j was not cut off
                pos_prop[a] += (col[1:] <= seen[:, None]).long()
                pos_acc[a] += (col[1:] <= counted[:, None]).long()
                at_prop[a] = at_prop[a].scatter_add(1, at, (col[1:] <= seen[:, None]).long())
                at_acc[a] = at_acc[a].scatter_add(1, at, (col[1:] <= counted[:, None]).long())
                hist[a, counted] += 1
                done[a] = (first_eos < n_emit) | (emitted[a] >= max_new_tokens)
                bar.update(int(done[a].sum()))
        out = self._report(seq, lens, n, emitted, verify_ct, correct, pos_acc, pos_prop, hist, k)
        out["positions"] = {"accepted_at": at_acc.sum(0).tolist(), "proposed_at": at_prop.sum(0).tolist()}
        out["metrics"].update(positions.binned(**out["positions"], limit=max_new_tokens))
        return out

    @staticmethod
    def _report(seq, lens, n, emitted, verify_ct, correct, pos_acc, pos_prop, hist, k: int) -> dict:
        requests, counters = [], []
        for r in range(len(lens)):
            c = Counters(k=k, verify_ct=int(verify_ct[r]), completion_tokens=int(emitted[r]),
                         correct_drafts=int(correct[r]), pos_accepted=tuple(pos_acc[r].tolist()),
                         pos_proposed=tuple(pos_prop[r].tolist()))
            counters.append(c)
            ct = c.verify_ct
            requests.append({
                "output_ids": seq[r, lens[r]:n[r]].tolist(), "completion_tokens": c.completion_tokens,
                "spec_verify_ct": ct, "spec_num_correct_drafts": c.correct_drafts, "spec_num_proposed_drafts": ct * k,
                "spec_accept_length": c.completion_tokens / ct if ct else math.nan,
                "spec_accept_rate": c.correct_drafts / (ct * k) if ct else math.nan,
                "spec_accept_rate_pos": [a / p if p else math.nan for a, p in zip(c.pos_accepted, c.pos_proposed)],
                "spec_accepted_pos": list(c.pos_accepted), "spec_proposed_pos": list(c.pos_proposed),
                "spec_correct_drafts_histogram": hist[r].tolist(),
            })
        return {"requests": requests, "metrics": Counters.total(counters, k).metrics()}
