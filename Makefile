# Two entry points, each creating and filling its own virtualenv (.venv) from requirements.txt.
#   make demo   the main job on the embedded default (real Megatron-core + SGLang + Ray on CPU)
#   make test   the test suite (unit + integration on CPU; GPU tests skip with a reason)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.labkit-installed

.PHONY: demo test install clean chromium

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	@# Byte-compiled once, here, on every core: pip would compile its ~42,000 files one by one (about 3 minutes on
	@# 2 cores), and without .pyc files a box that sets PYTHONDONTWRITEBYTECODE=1 (this one and CI's) compiles every
	@# import again in every process. A file that does not compile is only compiled at import (pip skips it too).
	$(PY) -m pip install --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-compile -e . --no-deps
	@# JupyterLab's jupyter-events asks for jsonschema[format-nongpl], whose rfc3987-syntax builds 39 lark grammars when
	@# jsonschema is imported, and Ray imports jsonschema: every Ray daemon, actor and worker pays it (`import ray`
	@# 1.89 s against 0.48, data/import_cost_cpu.json). Only jsonschema's optional "iri" format check needs it.
	$(PY) -m pip uninstall -q -y rfc3987-syntax
	-$(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1
	@# One torch only: the version SGLang pins. Fail loudly if a resolver pulled another.
	$(PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '2.14.1' else f'torch {v} installed; expected 2.14.1')"
	touch $(STAMP)

# Headless Chromium (Debian's package) for the real-browser notebook test; it skips with the reason without it.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; }; } || echo "chromium not installed: the browser test will skip (Debian: apt-get install -y chromium)"

demo: $(STAMP)
	$(VENV)/bin/labkit demo
	$(VENV)/bin/labkit notebook run 01_weight_update

test: $(STAMP) chromium
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
