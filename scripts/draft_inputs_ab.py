"""The shipped tiny MiMo's MTP draft measured by labkit's speculative loop with the draft inputs the trainer uses
and with SGLang's (the token embedding at position 0 zeroed, `models/mimo_mtp.py:58`): what an engine would
accept against what labkit's loop reported (labkit.mtp.speculative, `draft_inputs`). Held-out arithmetic
problems (the task's evaluation set, disjoint from pretraining), greedy and T = 1, k = 1..3 drafts per step.

    python scripts/draft_inputs_ab.py --out data/draft_inputs_ab_cpu.json

Prints one JSON line; with --out also writes it with its provenance."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit import provenance  # noqa: E402


def main() -> None:
    import torch

    from labkit.models.tiny import default_model_dir
    from labkit.mtp.rl import RLConfig
    from labkit.mtp.speculative import DRAFT_INPUTS, Speculator
    from labkit.tasks import ArithTask

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    task = ArithTask()
    ids = [task.tokenizer.encode(p.prompt) for p in task.evaluation(a.prompts)]
    record = {"command": "python scripts/draft_inputs_ab.py " + " ".join(sys.argv[1:]),
              "provenance": provenance.collect(config=vars(a)), "max_new_tokens": RLConfig().max_new_tokens,
              "prompts": len(ids), "runs": []}
    spec = {mode: Speculator(default_model_dir(), draft_inputs=mode) for mode in DRAFT_INPUTS}
    for t in (float(x) for x in a.temperatures.split(",")):
        for k in (int(x) for x in a.ks.split(",")):
            for mode, sp in spec.items():
                m = sp.generate(ids, k=k, temperature=t, max_new_tokens=RLConfig().max_new_tokens, seed=0,
                                progress=False)["metrics"]
                record["runs"].append({"draft_inputs": mode, "k": k, "temperature": t, **m})
    print(json.dumps(record))
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
