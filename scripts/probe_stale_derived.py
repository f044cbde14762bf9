"""What the behaviour probe reads when DeepSeek's derived MLA weights (w_kc/w_vc, from kv_b_proj) are left stale,
beside a correct sync of the same weights: the numbers tests/integration/test_fp8.py sets its limit from.

On labkit's `deepseek-v3-fp8` preset (a block-FP8 engine, bf16 activations), with a transformers model of the
unquantized weights as the trainer (tests/integration/test_fp8.py's Scorer): the engine first serves a shifted copy
of the preset's original weights; then, per move of kv_b_proj alone (negated, doubled, halved, reset to the
original), the moved weights are synced twice: once with the engine's re-derivation skipped (the `engine.derive`
failpoint: every byte verifies, generation keeps the old kv_b_proj) and once as labkit syncs (re-derived).

    python scripts/probe_stale_derived.py --out data/probe_stale_derived_cpu.json

Prints one JSON line; with --out also writes it with its provenance."""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402

MOVES = {"negated": lambda t, orig: -t, "doubled": lambda t, orig: 2 * t, "halved": lambda t, orig: 0.5 * t,
         "original": lambda t, orig: orig}


def measure(tokens: int, work: Path) -> dict:
    import torch

    from labkit import failpoints as fp
    from labkit.cluster import runtime
    from labkit.engine import EngineConfig, EngineHandle
    from labkit.models import fp8
    from labkit.models.families import family_model_dir
    from labkit.models.tiny import save_weights_as
    from labkit.sync import SyncConfig
    from labkit.sync.atomic import guard_for
    from labkit.sync.spec import checked_expected
    from tests.integration.test_fp8 import Scorer, _load

    model_dir = family_model_dir("deepseek-v3-fp8", work / "model")
    master = f"{model_dir}/{fp8.MASTER}"
    orig = _load(f"{master}/model.safetensors")
    g = torch.Generator().manual_seed(7)  # the shift tests/integration/test_fp8.py applies
    shifted = {n: t + 0.05 * torch.randn(t.shape, generator=g) for n, t in orig.items()}
    base = Scorer(save_weights_as(master, work / "shifted", shifted))
    runtime.init()
    engine = EngineHandle.start(EngineConfig(model_dir=model_dir, dtype="bfloat16", mem_fraction_static=0.05,
                                             max_total_tokens=2048, random_seed=0))
    guard, out = guard_for(engine), {}
    cfg = SyncConfig(probe=tokens, probe_kl_max=1e9, bucket_mb=8.0, progress=False)  # measure, never fail
    try:
        for name, move in MOVES.items():
            moved = Scorer(save_weights_as(master, work / name, {
                n: move(t, orig[n]) if ".kv_b_proj." in n else t for n, t in shifted.items()}))
            row = {"base": guard.sync(base, cfg, checked_expected(engine, ()), f"{name}-base")}
            fp.arm_in_actor(engine._actor, "engine.derive", "skip")
            try:
                row["stale"] = guard.sync(moved, cfg, checked_expected(engine, ()), f"{name}-stale")
            finally:
                fp.disarm_in_actor(engine._actor)
            guard.sync(base, cfg, checked_expected(engine, ()), f"{name}-base-again")
            row["derived"] = guard.sync(moved, cfg, checked_expected(engine, ()), f"{name}-derived")
            out[name] = {k: {"verified": m["sync/verified"], "probe_kl": m["sync/probe_kl"],
                             "probe_max_abs_logprob_diff": m["sync/probe_max_abs_logprob_diff"]}
                         for k, m in row.items()}
    finally:
        engine.shutdown()
        runtime.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    record = {"command": "python scripts/probe_stale_derived.py " + " ".join(sys.argv[1:]),
              "provenance": provenance.collect(config=vars(a))}
    with tempfile.TemporaryDirectory() as work:
        record["deepseek-v3-fp8"] = measure(a.tokens, Path(work))
    print(json.dumps(record))
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
