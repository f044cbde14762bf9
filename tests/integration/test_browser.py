"""One real-browser test: JupyterLab on 127.0.0.1, headless Debian Chromium driven by playwright, opens
01_weight_update, runs all cells, waits for the rendered plotly figure and saves a screenshot under runs/.

Needs the system Chromium (`apt-get install -y chromium`) and the playwright Python package; playwright's own
browser download is never used (executable_path points at /usr/bin/chromium). Skips with the reason otherwise.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# As root in a sandboxed box with no network: no sandbox, no GPU, no background connections that would be
# refused (and retried) by the closed network.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
RUN_TIMEOUT_S = 600  # Ray + Megatron trainer + SGLang engine start inside the kernel (~60-90 s on 2 cores)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def lab(tmp_path):
    """JupyterLab serving a copy of the notebook from a temp dir, with temporary JUPYTER_* dirs."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / "01_weight_update.ipynb", work)  # autosave must never touch the repo copy
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "rt"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[var] = str(tmp_path / sub)
    env["LABKIT_METRICS"] = str(tmp_path / "metrics.json")  # the kernel inherits it: the test reads numbers
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()[-2000:]}")
                time.sleep(1)
        yield {"base": base, "token": token, "metrics": tmp_path / "metrics.json", "log": tmp_path / "lab.log"}
    finally:
        proc.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_lab_runs_01_and_renders_the_plotly_figure(lab):
    from playwright.sync_api import sync_playwright

    shots = ROOT / "runs" / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-browser"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{lab['base']}/lab/tree/01_weight_update.ipynb?token={lab['token']}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            # The kernel (python3, from the notebook's kernelspec) must be up before "run all".
            page.wait_for_function("() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                                   " return w && w.sessionContext && w.sessionContext.session &&"
                                   " w.sessionContext.session.kernel &&"
                                   " w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            plot = page.wait_for_selector(".js-plotly-plot .main-svg", timeout=RUN_TIMEOUT_S * 1000)
            # Wait until every cell has run (no "[*]" prompt left), so the close cell has shut Ray down.
            page.wait_for_function("() => { const w = window.jupyterapp.shell.currentWidget;"
                                   " return w.sessionContext.session.kernel.status === 'idle' &&"
                                   " ![...document.querySelectorAll('.jp-InputPrompt')]"
                                   ".some(e => e.textContent.includes('*')); }", timeout=RUN_TIMEOUT_S * 1000)
            plot.scroll_into_view_if_needed()
            plot.screenshot(path=str(shots / "01_weight_update_figure.png"))
            page.screenshot(path=str(shots / "01_weight_update_page.png"))
            n_traces = page.evaluate("() => document.querySelector('.js-plotly-plot').data.length")
            errors = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                                   ".filter(e => e.textContent.includes('Traceback')).length")
        finally:
            browser.close()
    assert n_traces >= 7, n_traces  # six phases + the wall-total marker
    assert errors == 0, f"a cell raised; see {shots / '01_weight_update_page.png'}"
    assert (shots / "01_weight_update_figure.png").stat().st_size > 10_000
    metrics = json.loads(lab["metrics"].read_text())
    assert metrics["sync/verified"] is True, metrics
    print(f"screenshots: {shots}")
