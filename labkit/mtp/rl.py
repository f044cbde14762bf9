"""GRPO-style RL on the arithmetic task, with the MTP draft trained alongside and synced after every step.

One `step`: rollouts from the SGLang engine (a group of samples per prompt) -> exact-answer rewards ->
group-normalised advantages -> one trainer forward on the rollouts (train-vs-rollout KL, and the offline
acceptance estimate from the same logits) -> one optimizer step: policy loss weighted by the advantages, plus
the MTP loss on the response tokens with the trunk detached -> weight sync.

A single on-policy update per batch makes GRPO's importance ratio 1, so the clipped objective reduces to
advantage-weighted log-likelihood; no reference-model KL term (the task needs none).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from labkit.config import TrainConfig, check, number
from labkit.models.tokenizer import PAD
from labkit.mtp.acceptance import by_entropy, offline_accept_rate, offline_loop_rate
from labkit.mtp.rollout import rollout
from labkit.sync import SyncConfig, sync
from labkit.tasks import ArithTask


def rl_train_config() -> TrainConfig:
    """The trainer settings RL starts from: MTP loss on the response tokens with the trunk detached."""
    # lr: Adam without the pretraining state; 4e-4 already costs greedy accuracy. mtp_loss_scale: the MTP layers
    # only see MTP gradients (detached), so this is their loss weight. mtp_lr_mult: the shipped draft must relearn
    # to read a post-trained trunk, which at the policy's lr outlasts an RL run. How these defaults were chosen,
    # and a pre-registered replication with the draft lr at 1x: docs/mtp.md, docs/preregistration/.
    return TrainConfig(lr=2e-4, mtp_loss_scale=1.0, mtp_detach=True, mtp_lr_mult=5.0)


@dataclass(kw_only=True, slots=True, frozen=True)
class RLConfig:
    """One GRPO step's rollout and schedule settings; the optimizer and MTP-loss settings are `train`'s."""
    prompts: int = 64
    """Prompts per step: the draft relearns the sums from the distinct problems it sees."""
    group: int = 4
    """Samples per prompt: the GRPO group."""
    temperature: float = 1.0
    """Rollout sampling temperature."""
    max_new_tokens: int = 5
    """Rollout length: "198" + EOS fits; longer answers are wrong anyway."""
    warmup: int = 5
    """Linear lr warmup steps: Adam's first steps are sign steps of size lr on every noisy coordinate."""
    train: TrainConfig = field(default_factory=rl_train_config)
    """The trainer's lr and MTP-loss settings (`rl_train_config()`: lr 2e-4, MTP loss 1.0 detached, 5x MTP lr)."""
    probe: int = 0
    """Each step's sync checks the engine's behaviour against the trainer's (SyncConfig.probe: tokens sampled per
    probe prompt; the step's row gets `sync/probe_kl`, the field's KL-per-refit check); 0: off."""

    def __post_init__(self) -> None:
        check(isinstance(self.warmup, int) and self.warmup >= 0, "warmup", self.warmup, "an integer >= 0")
        for f in ("prompts", "group", "max_new_tokens"):
            v = getattr(self, f)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f, v, "an integer >= 1")
        check(self.group >= 2, "group", self.group, "an integer >= 2 (advantages are normalised within a group)")
        check(number(self.probe, int) and self.probe >= 0, "probe", self.probe,
              "0 (off) or the tokens to sample per probe prompt")
        check(isinstance(self.temperature, (int, float)) and self.temperature > 0, "temperature", self.temperature,
              "> 0 (RL samples; greedy groups carry no signal)")
        check(isinstance(self.train, TrainConfig), "train", self.train, "a TrainConfig")
        check(self.train.mtp_detach, "train.mtp_detach", self.train.mtp_detach,
              "True: the MTP loss must not move the policy under RL (labkit.trainer.mtp_loss)")


def advantages(rewards: list[float], group: int) -> list[float]:
    """(r - mean) / (std + eps) within each consecutive group of `group` samples; all-equal groups give 0."""
    check(len(rewards) % group == 0, "rewards", len(rewards), f"a multiple of group={group}")
    out = []
    for g in range(0, len(rewards), group):
        rs = rewards[g:g + group]
        mean = sum(rs) / group
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / group)
        out += [(r - mean) / (std + 1e-6) for r in rs]
    return out


def sample_seed(*parts: int) -> int:
    """A 62-bit sampling seed from integers (experiment seed, step, prompt, sample): stable across processes
    and Python versions (no `hash()`), distinct for distinct tuples with overwhelming probability."""
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def sampling_params(n_problems: int, cfg: RLConfig, seed: tuple[int, ...] | None) -> list[dict]:
    """One SGLang sampling dict per (problem, sample); with `seed` (e.g. (experiment seed, step)) each carries
    `sampling_seed` = sample_seed(*seed, problem, sample), so equal weights give token-identical rollouts
    whichever arm or run asks (on CPU through labkit.compat.seeded)."""
    base = {"temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens}
    if seed is None:
        return [dict(base) for _ in range(n_problems * cfg.group)]
    return [{**base, "sampling_seed": sample_seed(*seed, i, j)} for i in range(n_problems) for j in range(cfg.group)]


def digest(rows: list[dict]) -> str:
    """16 hex chars over every rollout's tokens, in order: equal digests mean token-identical rollouts."""
    h = hashlib.sha256()
    for r in rows:
        h.update(",".join(map(str, r["tokens"])).encode() + b";")
    return h.hexdigest()[:16]


def to_batch(rows: list[dict]):
    """Right-padded prompt + completion ids [b, s], and masks [b, s]: every completion token, and the ones a
    draft proposes (all but the first, which the prefill emits)."""
    import torch


    seqs = [r["prompt_ids"] + r["tokens"] for r in rows]
    tokens = torch.full((len(seqs), max(map(len, seqs))), PAD, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, (r, s) in enumerate(zip(rows, seqs)):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, len(r["prompt_ids"]): len(s)] = 1
    drafted = mask.clone()
    for i, r in enumerate(rows):
        drafted[i, len(r["prompt_ids"])] = 0
    return tokens, mask, drafted


def missing_logprobs(rows: list[dict]) -> list[int]:
    """Indices of the rows without one engine log-prob per sampled token (None, or a ragged list)."""
    return [i for i, r in enumerate(rows) if r.get("logprobs") is None or len(r["logprobs"]) != len(r["tokens"])]


def paired_logprobs(logp, rows: list[dict]) -> tuple[list[float], list[float], list[int]]:
    """(engine, trainer, missing): per sampled token, the engine's log-prob and the trainer's (`logp`: log-softmax
    [b, s, V] over prompt + completion), for the rows that carry one engine log-prob per token; `missing` lists
    the rows that do not (an engine response without output_token_logprobs, or a ragged list).

    Rows without log-probs are skipped whole, never zipped against another row's tokens: the gap is only
    ever measured, never assumed to be 0.
    """
    engine, trainer, missing = [], [], missing_logprobs(rows)
    for i, r in enumerate(rows):
        if i in missing:
            continue
        p = len(r["prompt_ids"])
        for j, (t, lp) in enumerate(zip(r["tokens"], r["logprobs"])):
            engine.append(float(lp))
            trainer.append(float(logp[i, p + j - 1, t]))  # logits at p+j-1 predict token p+j
    return engine, trainer, missing


def rollout_kl(logits, rows: list[dict]) -> dict:
    """KL(rollout || trainer) over the sampled tokens (k1 estimator) and the largest |log-prob| gap.

    Right after a verified sync both sides hold the same bits, so this is float noise; a stale or
    half-updated engine shows up here first. Rows the engine returned without log-probs are not measured:
    they are counted in `train/rollout_logprob_missing_rows`, and with no measured token at all both gaps
    are NaN (not 0, which would read as perfect agreement). An RL run goes on; the diagnostic says so.
    """
    import torch

    engine, trainer, missing = paired_logprobs(torch.log_softmax(logits.float(), dim=-1), rows)
    diffs = [e - t for e, t in zip(engine, trainer)]
    nan = float("nan")
    return {"train/rollout_kl": sum(diffs) / len(diffs) if diffs else nan,
            "train/rollout_logprob_max_abs_diff": max(abs(d) for d in diffs) if diffs else nan,
            "train/rollout_logprob_missing_rows": len(missing)}


def greedy_accuracy(engine, problems, max_new_tokens: int = 5, task=None) -> float:
    """Mean task reward of the engine's greedy answers (held-out prompts: the policy's accuracy)."""
    task = task or ArithTask()
    outs = engine.generate(input_ids=[task.tokenizer.encode(p.prompt) for p in problems],
                           sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    return sum(task.reward(p, o["text"]) for p, o in zip(problems, outs)) / len(problems)


def lr_at(cfg: RLConfig, step: int) -> float:
    return cfg.train.lr * min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else cfg.train.lr


def step(trainer, engine, problems, cfg: RLConfig, *, step_index: int = 0, eval_problems=None, train: bool = True,
         sync_cfg=None,
         exclude: tuple[str, ...] = (), spec_temperature: float = 1.0, spec_k: int = 1, task=None,
         seed: tuple[int, ...] | None = None, mtp_only: bool = False) -> dict:
    """One RL step; returns its metrics. `train=False` measures only (the last point of a run); `mtp_only`
    trains the draft alone (the policy loss zeroed: labkit.mtp.warmup).

    train/reward: mean reward of this step's rollouts; train/accuracy: greedy accuracy on `eval_problems`;
    mtp/offline_accept_rate: the depth-1 acceptance a k-draft loop would see, from this step's forward
    (`offline_loop_rate`; `..._plain` weighs every drafted response token the same); rollout/digest: the
    rollouts' tokens (`seed`: per-request sampling seeds, see `sampling_params`).
    """
    import torch

    task = task or ArithTask()
    rows = rollout(engine, task, [p for p in problems for _ in range(cfg.group)],
                   sampling_params(len(problems), cfg, seed))  # cfg.group samples per problem
    rewards = [r["reward"] for r in rows]
    tokens, mask, drafted = to_batch(rows)
    out = trainer.forward(tokens)
    m = {"train/reward": sum(rewards) / len(rewards),
         "train/accuracy": greedy_accuracy(engine, eval_problems or problems, cfg.max_new_tokens, task),
         "rollout/weight_version": rows[0]["weight_version"], "rollout/digest": digest(rows),
         **rollout_kl(out["logits"], rows)}
    if out["mtp_logits"]:  # the offline acceptance estimate comes free with this forward
        mtp = out["mtp_logits"][0]
        plain, _ = offline_accept_rate(out["logits"], mtp, drafted, spec_temperature)
        rate, drafts = offline_loop_rate(out["logits"], mtp, [len(r["prompt_ids"]) for r in rows],
                                         [len(r["tokens"]) for r in rows], spec_temperature, spec_k)
        m.update({"mtp/offline_accept_rate": rate, "mtp/offline_accept_rate_plain": plain,
                  "mtp/offline_drafts": drafts,
                  "mtp/offline_by_entropy": by_entropy(out["logits"], mtp, drafted, spec_temperature)})
    if not train:
        return m
    adv = torch.tensor(advantages(rewards, cfg.group))
    trainer.set_lr(lr_at(cfg, step_index))
    t = trainer.train_step(tokens, mask, weights=adv, mtp_only=mtp_only)
    m.update({k: t[k] for k in ("train/loss", "mtp/loss", "mtp/kl", "train/grad_norm") if k in t})

    s = sync(trainer, engine, sync_cfg or SyncConfig(progress=False, probe=cfg.probe), exclude=exclude)
    m.update({"sync/verified": s.get("sync/verified"), "sync/weight_version": s.get("sync/weight_version"),
              "timing/sync/total": s.get("timing/sync/total")})
    m.update({k: v for k, v in s.items() if k.startswith("sync/probe_")})  # the sync's probe, when it ran one
    return m

