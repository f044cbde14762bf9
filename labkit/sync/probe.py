"""Does the engine behave like the trainer after a sync? A probe in behaviour, beside verification in bytes.

Checksums prove the engine holds the bytes that were sent. They cannot see what it computes from them: derived
weights rebuilt from a stale copy (DeepSeek's `w_kc`/`w_vc` from `kv_b_proj`), a cache of dequantized weights
not dropped (NeMo-RL #3739), a kernel that reads another layout than the one written (verl #7986: rollout KL 25x
the bf16 baseline while the layer audit passed). The field's check is the rollout's KL against the trainer, per
refit; this is that check, on a fixed probe batch, after every sync that asks for it (`SyncConfig.probe`):

1. the engine samples `probe` tokens for each of `PROMPTS` fixed prompts (seeded, temperature 1) and returns
   each token's log-probability;
2. the trainer scores the same sequences (its own forward, `producer.forward`);
3. per token, d = log p_trainer - log p_engine; `sync/probe_kl` = mean(exp(d) - 1 - d), the k3 estimator of
   KL(engine || trainer) over tokens the engine drew (Schulman's; unbiased, never negative), and
   `sync/probe_max_abs_logprob_diff` = max |d|.

An fp32 engine and an fp32 trainer agree to ~1e-9; a bf16 or block-FP8 engine shows its own rounding (the
quantization's own KL). Above `SyncConfig.probe_kl_max` (`limit`) the sync fails (labkit.sync.atomic restores).
The probe runs once the engine serves again: it needs generation, which a paused engine holds.
"""

from __future__ import annotations

PROMPTS = 4  # prompts in the probe batch
PROMPT_LEN = 8  # tokens per prompt
SEED = 20261127  # the probe batch's and the sampler's seed: the same probe every sync


def prompts(vocab: int, n: int = PROMPTS, length: int = PROMPT_LEN, seed: int = SEED) -> list[list[int]]:
    """The fixed probe batch: `n` prompts of `length` token ids drawn below `vocab` (the checkpoint's vocabulary
    rows, so every id is a real row on both sides)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def measure(producer, engine, tokens: int, vocab: int, seed: int = SEED) -> dict:
    """`sync/probe_kl`, `sync/probe_max_abs_logprob_diff`, `sync/probe_tokens` of the engine against `producer`
    (anything with `forward(token_ids [1, s]) -> {"logits": [1, s, >= vocab]}`: the Trainer)."""
    import torch

    if not hasattr(producer, "forward"):
        raise ValueError(f"SyncConfig.probe={tokens}: the producer ({type(producer).__name__}) cannot score tokens "
                         "(no forward); the probe compares the engine with a trainer")
    batch = prompts(vocab, seed=seed)
    outs = engine.generate(input_ids=batch, return_logprob=True, sampling={
        "max_new_tokens": tokens, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True})
    diffs = []
    for ids, out in zip(batch, outs):
        new = out["tokens"]
        seq = torch.tensor([ids + new[:-1]])
        logits = producer.forward(seq)["logits"][0, len(ids) - 1:, :vocab].double()
        mine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(new)[:, None])[:, 0]
        diffs.append(mine - torch.tensor(out["logprobs"], dtype=torch.float64))
    d = torch.cat(diffs)
    return {"sync/probe_kl": float((d.exp() - 1 - d).mean()), "sync/probe_max_abs_logprob_diff": float(d.abs().max()),
            "sync/probe_tokens": int(d.numel())}


def vocab_of(spec: dict) -> int:
    """The checkpoint's vocabulary rows, from an engine spec (labkit.sync.spec.engine_spec)."""
    return int(spec["tensors"]["model.embed_tokens.weight"][0][0])


# `SyncConfig.probe_kl_max=None`: the limit by the engine's precision, from data/probe_calibration_cpu.json (made
# by scripts/probe_calibration.py): a correct fp32 sync reads <= 1.2e-9 and an engine one training step stale
# >= 1.1e-3, so 1e-4 sits a decade from each; a correct block-FP8 sync reads 0.05-0.08 on labkit's FP8 preset (its
# quantization's own KL, as large there as one step's drift: the bytes, not the probe, catch a stale FP8 engine),
# so 0.25 fails what computes far from the trainer (a broken kernel, a wrong layout, weights cast with old scales).
LIMITS = {"float32": 1e-4, "other": 0.25}


def limit(kl_max: float | None, spec: dict) -> float:
    """The probe's threshold: `kl_max` if given, else by the engine's serving dtype and quantization."""
    if kl_max is not None:
        return kl_max
    return LIMITS["float32"] if spec.get("dtype") == "float32" and not spec.get("quant") else LIMITS["other"]


def verdict(m: dict, kl_max: float) -> str | None:
    """Why the probe fails the sync (None: it passes)."""
    kl = m["sync/probe_kl"]
    if kl != kl or kl > kl_max:  # NaN fails too
        return (f"behaviour probe failed: sync/probe_kl={kl:.3g} > probe_kl_max={kl_max:g} over "
                f"{m['sync/probe_tokens']} tokens (max |log-prob diff| {m['sync/probe_max_abs_logprob_diff']:.3g}): "
                "the engine holds the bytes sent but does not compute what the trainer does")
    return None
