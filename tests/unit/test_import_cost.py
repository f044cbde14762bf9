"""What every Ray process pays at import: labkit's install leaves out what only costs there (Makefile, install)."""

import subprocess
import sys


def test_importing_ray_builds_no_iri_grammars():
    """jsonschema imports rfc3987-syntax when it is installed (JupyterLab's jupyter-events asks for it), and that
    builds 39 lark grammars: `import ray` took 1.89 s against 0.48 without it (data/import_cost_cpu.json), in each
    Ray daemon, actor and worker, for an "iri" format check nothing in labkit's processes makes. `make install`
    uninstalls it."""
    code = "import sys, ray; print(sorted(m for m in ('rfc3987_syntax', 'lark') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"`import ray` imported {out.stdout.strip()}: run `make install` again"
