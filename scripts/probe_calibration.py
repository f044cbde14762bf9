"""What `sync/probe_kl` reads on a correct sync and on a stale engine, for an fp32 engine and a block-FP8 one:
the numbers `SyncConfig.probe_kl_max` is set from (docs/fp8.md). Per model: train a step, sync with the probe
(fresh), then train `--stale-steps` more and probe the engine without syncing (stale: the engine serves the
weights of the sync before, as an engine whose update silently failed would).

    python scripts/probe_calibration.py --out data/probe_calibration_cpu.json

Prints one JSON line; with --out also writes it with its provenance."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402


def measure(model: str | None, tokens: int, stale_steps: int) -> dict:
    from labkit.sync import SyncConfig, probe
    from labkit.sync.spec import engine_spec
    from labkit.workbench import Workbench

    with Workbench(model, progress=False) as wb:
        wb.train(1, progress=False)
        m = wb.sync(SyncConfig(progress=False, probe=tokens, probe_kl_max=1e9))
        vocab = probe.vocab_of(engine_spec(wb.engine.cfg.model_dir, wb.engine.cfg.dtype))
        out = {"engine_dtype": wb.engine.cfg.dtype, "verified": m["sync/verified"],
               "fresh": {k.removeprefix("sync/"): m[k] for k in m if k.startswith("sync/probe")}}
        wb.train(stale_steps, progress=False)
        stale = probe.measure(wb.trainer, wb.engine, tokens, vocab)
        out["stale"] = {k.removeprefix("sync/"): v for k, v in stale.items()}
        out["stale_steps"] = stale_steps
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mimo,qwen3-moe,qwen3-moe-fp8")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--stale-steps", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    record = {"command": "python scripts/probe_calibration.py " + " ".join(sys.argv[1:]),
              "provenance": provenance.collect(config=vars(a))}
    for model in a.models.split(","):
        record[model] = measure(None if model == "mimo" else model, a.tokens, a.stale_steps)
    print(json.dumps(record))
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
