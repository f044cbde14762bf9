"""scripts/copyruns_bench.py runs on CPU in a small size, so the script the GPU runs (data/copyruns_h100_*.json)
cannot rot between device sessions (it once replaced the plan table by a plain dict and stopped at its first plan)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_copyruns_script_runs_small_on_cpu_checks_both_ways_bitwise_and_stores_provenance(tmp_path):
    out = tmp_path / "copyruns.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "copyruns_bench.py"), "--device", "cpu", "--experts", "4",
                    "--inter", "32", "--hidden", "64", "--reps", "2", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    run = json.loads(out.read_text())
    assert run["bitwise_equal"] is True and run["tensors"] == 12
    assert run["copies_merged"] < run["tensors"]
    assert run["provenance"]["commit"] and run["provenance"]["config"]["experts"] == 4
