"""Acceptance as the engine measures it: SGLang's own speculative decoding (EAGLE/NEXTN with the MTP layer as the
draft, `EngineConfig.speculative`), read off its per-request counters, and labkit's loop as the cross-check.

The engine's counters are what a team sees in production (SGLang's `spec_accept_rate` et al. in meta_info), from the
draft the engine's draft runner holds: the one a sync delivered or failed to deliver. labkit's loop
(labkit.mtp.speculative) recomputes it from exported weights; run on SGLang's draft inputs (`draft_inputs="sglang"`:
position 0's token embedding zeroed, as SGLang's MiMoMTP does) and greedily, both verify the same drafts against
the same target argmax, so their accept rates differ only where fp32 near-ties break differently
(`mtp/engine_vs_loop_accept_diff`, per depth too), the loop counting every draft a verify step accepted, as SGLang
does, also past the EOS or token budget that ends the request (`counts="verified"`). At T > 0 they measure different
rules: SGLang verifies target-only (a draft x is kept with probability p(x); labkit.compat.spec_cpu.sampling),
labkit's loop by rejection sampling (min(1, p/q)), which accepts more; so only the greedy pair is compared.
"""

from __future__ import annotations

import math

from labkit.mtp.acceptance import parse_sglang_meta
from labkit.mtp.rl import sample_seed
from labkit.mtp.warmup import DRAFT_LAYERS


def measure(model_dir: str, named: dict, draft: dict | None, eval_ids: list[list[int]], cfg, seed: int) -> dict:
    """labkit's speculative loop with the MTP draft over the given weights (`cfg`: the experiment's
    ExperimentConfig); acceptance under stable keys."""
    from labkit.mtp.speculative import Speculator  # torch; the CLI imports this module for its config

    speculator = Speculator(model_dir, named, draft_weights=draft)
    out = speculator.generate(eval_ids, k=cfg.k, temperature=cfg.spec_temperature,
                              max_new_tokens=cfg.rl.max_new_tokens, seed=seed, progress=False)
    return {k: v for k, v in out["metrics"].items() if k.startswith("mtp/")}


def engine_draft(engine, named: dict) -> dict:
    """The MTP draft layers as the engine holds them (read back from its draft store), in the export's dtype."""
    return {n: engine.get_weights_by_name(n).to(t.dtype).reshape(t.shape)
            for n, t in named.items() if any(x in n for x in DRAFT_LAYERS)}


def draft_bytes(named: dict) -> int:
    """Bytes of the MTP draft layers in an export: what a sync carrying the draft sends for it."""
    return sum(t.numel() * t.element_size() for n, t in named.items() if any(x in n for x in DRAFT_LAYERS))


def engine_acceptance(engine, ids: list[list[int]], k: int, temperature: float, max_new_tokens: int,
                      seed: int) -> dict:
    """The speculative engine's counters over held-out prompts `ids` (`mtp/` keys of labkit.mtp.acceptance), each
    request seeded (`sampling_seed`) so a weight version measured twice gives the same numbers."""
    sampling = [{"temperature": float(temperature), "max_new_tokens": max_new_tokens,
                 "sampling_seed": sample_seed(seed, i)} for i in range(len(ids))]
    outs = engine.generate(input_ids=ids, sampling=sampling)
    return parse_sglang_meta([o["meta_info"] for o in outs], k)


def cross_check(engine, model_dir: str, named: dict, draft: dict | None, ids: list[list[int]], k: int,
                max_new_tokens: int) -> dict:
    """Greedy acceptance from the engine's counters and from labkit's loop on SGLang's draft inputs, over the same
    prompts and weights (`named`; `draft`: the draft the engine holds where it is not the trainer's):
    {mtp/engine_greedy_accept_rate, mtp/loop_greedy_accept_rate, mtp/engine_vs_loop_accept_diff and per depth
    mtp/engine_vs_loop_accept_diff_pos_{i}} (|engine - loop|)."""
    from labkit.mtp.speculative import Speculator  # torch

    eng = engine_acceptance(engine, ids, k, 0.0, max_new_tokens, seed=0)
    loop = Speculator(model_dir, named, draft_weights=draft, draft_inputs="sglang").generate(
        ids, k=k, temperature=0.0, max_new_tokens=max_new_tokens, progress=False, counts="verified")["metrics"]
    out = {"mtp/engine_greedy_accept_rate": eng["mtp/accept_rate"],
           "mtp/loop_greedy_accept_rate": loop["mtp/accept_rate"],
           "mtp/engine_vs_loop_accept_diff": abs(eng["mtp/accept_rate"] - loop["mtp/accept_rate"])}
    for i in range(1, k + 1):
        a, b = eng.get(f"mtp/accept_rate_pos_{i}", math.nan), loop.get(f"mtp/accept_rate_pos_{i}", math.nan)
        out[f"mtp/engine_vs_loop_accept_diff_pos_{i}"] = abs(a - b)
    return out


def draft_runner_is_store(engine) -> bool:
    """Whether the engine's draft runner holds what its draft store holds (labkit.engine.draft: SGLang's checksums
    of both), so that a read-back of the store is the draft the engine drafts with."""
    from labkit.engine import draft

    ck = engine.checksums()
    mirrors = draft.mirrored({k: v for k, v in ck.items() if not k.startswith(draft.DRAFT)}, ck)
    return bool(mirrors) and all(ck.get(k) == v for k, v in mirrors.items())


def measure_step(spec_engine, trainer, model_dir: str, named: dict, eval_ids: list[list[int]], cfg, seed: int,
                 exclude: tuple[str, ...], version: str) -> dict:
    """One MTP-experiment step with `spec="engine"`: the speculative engine synced as the rollout engine was at the
    end of the previous step (`exclude`: what that sync left out), then acceptance from its counters at the
    experiment's temperature (the primary `mtp/` keys), labkit's loop at the same temperature beside it
    (`mtp/loop_*`), the greedy cross-check, and whether the sync was verified on the draft runner too."""
    from labkit.sync import SyncConfig, sync

    s = sync(trainer, spec_engine, SyncConfig(progress=False), weight_version=version, exclude=exclude)
    draft = engine_draft(spec_engine, named) if exclude or cfg.cadence().stale_between else None
    out = engine_acceptance(spec_engine, eval_ids, cfg.k, cfg.spec_temperature, cfg.rl.max_new_tokens, seed)
    loop = measure(model_dir, named, draft, eval_ids, cfg, seed)
    out.update({f"mtp/loop_{k.removeprefix('mtp/')}": v for k, v in loop.items()})
    out.update(cross_check(spec_engine, model_dir, named, draft, eval_ids, cfg.k, cfg.rl.max_new_tokens))
    # the draft runner's own parameters checked, where this sync carried them (None: it left the draft out)
    out["mtp/draft_verified"] = None if exclude else bool(s.get("sync/verified")) and s["verify/draft_checked"] > 0
    out["mtp/draft_runner_is_store"] = draft_runner_is_store(spec_engine)
    return out


def tokens_per_s(engine, ids: list[list[int]], max_new_tokens: int) -> float:
    """Generated tokens per second of one greedy batch over `ids`, end to end (the call as a client waits for it)."""
    import time

    t0 = time.perf_counter()
    outs = engine.generate(input_ids=ids, sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    return sum(len(o["tokens"]) for o in outs) / (time.perf_counter() - t0)


def speedup(spec_engine, plain_engine, ids: list[list[int]], max_new_tokens: int) -> dict:
    """`spec/speedup`: the speculative engine's generated tokens per second over the plain engine's (same model,
    weights, prompts and settings but the draft). On a CPU engine only the ratio means something, and little: the
    draft and verify forwards run in Python loops there (labkit.compat.spec_cpu)."""
    plain_engine.generate(input_ids=ids[:1], sampling={"temperature": 0.0, "max_new_tokens": 2})  # warm both
    spec_engine.generate(input_ids=ids[:1], sampling={"temperature": 0.0, "max_new_tokens": 2})
    spec, plain = tokens_per_s(spec_engine, ids, max_new_tokens), tokens_per_s(plain_engine, ids, max_new_tokens)
    return {"spec/tokens_per_s": spec, "spec/plain_tokens_per_s": plain, "spec/speedup": spec / plain}
