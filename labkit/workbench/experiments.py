"""Small experiments the notebooks run on a Workbench, one call per notebook cell.

rollouts come from `wb.rollout` (engine generations scored by the workbench's task); `table` and
`side_by_side` lay their samples out for a notebook.
cold_and_warm: a first sync (it plans and allocates) and the one after it, which is what every RL step pays.
logprob_agreement: the engine's per-token log-probs vs the trainer's own forward on the same tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, is_dataclass

from labkit.models.tokenizer import PAD
from labkit.mtp.rl import missing_logprobs, paired_logprobs
from labkit.workbench.core import Rollout


def logprob_agreement(wb, rows: list[dict]) -> dict:
    """Teacher-force prompt + completion through the trainer and compare log-probs of the sampled tokens.

    The engine reports log-probs of the raw logits (temperature does not change them), so after a sync the
    two sides should agree to float rounding; a stale engine shows up as a large difference. Rows without
    the engine's log-probs raise ValueError naming them: an agreement that was not measured is never reported.
    """
    import torch


    missing = missing_logprobs(rows)  # before the trainer's forward: fail fast, naming the rows
    if missing:
        raise ValueError(f"logprob_agreement: {len(missing)} of {len(rows)} rows carry no engine log-probs, one "
                         f"per token (rows {missing[:8]}): the engine response had no output_token_logprobs; "
                         "generate with return_logprob=True (wb.rollout does)")
    seqs = [r["prompt_ids"] + r["tokens"] for r in rows]
    tokens = torch.full((len(seqs), max(map(len, seqs))), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    logp = torch.log_softmax(wb.trainer.forward(tokens)["logits"].float(), dim=-1)
    engine_lp, trainer_lp, _ = paired_logprobs(logp, rows)
    if not engine_lp:
        raise ValueError(f"logprob_agreement: the {len(rows)} rows hold no sampled token: nothing to compare")
    diffs = [abs(a - b) for a, b in zip(trainer_lp, engine_lp)]
    return {"max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs),
            "trainer": trainer_lp, "engine": engine_lp}


def cold_and_warm(wb, cfg) -> tuple[dict, dict]:
    """Two syncs with the same settings: the cold one plans and allocates its buffers (`timing/sync/setup`, a
    one-off), the warm one replays both, which is what an RL loop pays every step. Both metrics, in that order."""
    return wb.sync(cfg), wb.sync(cfg)


def peer_sync(wb, cfg) -> tuple[dict, ...]:
    """`cold_and_warm` with SGLang's stock loader (SyncConfig.engine_loader="sglang": flattened buckets, one
    engine call each, the model's `load_weights`), the method verl and slime ship, to set beside labkit's own;
    () where the transport has no stock counterpart (per-tensor, direct)."""
    if cfg.transport not in ("colocated", "distributed"):
        return ()
    return cold_and_warm(wb, dataclasses.replace(cfg, engine_loader="sglang"))


def table(r: Rollout) -> list[dict]:
    """One row per sample for a DataFrame: the problem's own fields (a dataclass's, e.g. the answer), then
    completion, reward and weight version; token ids and log-probs left out."""
    return [{**(asdict(s["problem"]) if is_dataclass(s["problem"]) else {"prompt": s["prompt"]}),
             "completion": s["completion"], "reward": s["reward"], "weight_version": s["weight_version"]}
            for s in r.samples]


def side_by_side(before: Rollout, after: Rollout) -> list[dict]:
    """Rows of two rollouts on the same prompts (same seed), for a before/after table."""
    return [{**{k: v for k, v in a.items() if k not in ("completion", "reward", "weight_version")},
             "before": a["completion"], "after": b["completion"], "reward before": a["reward"],
             "reward after": b["reward"], "version": f"{a['weight_version']} -> {b['weight_version']}"}
            for a, b in zip(table(before), table(after))]
