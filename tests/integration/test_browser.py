"""One real-browser test, as a person uses notebook 01 in JupyterLab: JupyterLab on 127.0.0.1, headless Debian
Chromium driven by playwright, 01_weight_update with `INTERACTIVE = True`: run all cells (the phase figure
renders, the controls appear), then pick a transport, move the bucket slider and press Run (exactly one sync,
and the controls' figure shows it at the new size), then press Run twice in a row (one more sync, not two on
top of each other). Screenshots go under runs/.

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
    # A copy (autosave must never touch the repo's), with the controls on as a person exploring would set them.
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "01_weight_update.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert "INTERACTIVE = False" in params.source
    params.source = params.source.replace("INTERACTIVE = False", "INTERACTIVE = True")
    nbformat.write(nb, work / "01_weight_update.ipynb")
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


KERNEL = "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
ALL_RAN = ("() => { const w = window.jupyterapp.shell.currentWidget;"
           " return w.sessionContext.session.kernel.status === 'idle' &&"
           " ![...document.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*')); }")
# The controls' own figure is the last plotly plot on the page (below the notebook's phase figure).
EXPLORER_X = "() => { const p = [...document.querySelectorAll('.widget-output .js-plotly-plot')];" \
             " return p.length ? p[p.length - 1].data[0].x : []; }"

STATUS_ERROR = "[...document.querySelectorAll('.widget-html')].some(e => e.textContent.includes('Error'))"


def _run_all(page, lab) -> None:
    page.goto(f"{lab['base']}/lab/tree/01_weight_update.ipynb?token={lab['token']}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    # The kernel (python3, from the notebook's kernelspec) must be up before "run all".
    page.wait_for_function(f"() => {{ try {{ return {KERNEL}.status === 'idle'; }} catch (e) {{ return false; }} }}",
                           timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=RUN_TIMEOUT_S * 1000)
    page.wait_for_function(ALL_RAN, timeout=RUN_TIMEOUT_S * 1000)


def _press_run(page, run: int, times: int = 1) -> None:
    """Press Run (`times` in a row); wait until the status reports sync `run` and its figure is drawn (or an error)."""
    button = page.get_by_role("button", name="Run sync")
    if times == 1:
        button.click()
    else:
        button.dblclick()  # the second press lands while the first sync runs
    page.wait_for_function(f"() => [...document.querySelectorAll('.widget-html')].some(e =>"
                           f" e.textContent.includes('run {run}')) || {STATUS_ERROR}", timeout=120_000)
    # The browser draws the figure after the kernel sent it (plotly renders asynchronously): wait for its bars.
    page.wait_for_function(f"() => {{ if ({STATUS_ERROR}) return true;"
                           f" try {{ return ({EXPLORER_X})().length >= {run}; }} catch (e) {{ return false; }} }}",
                           timeout=60_000)


def test_lab_runs_01_and_its_controls_work(lab):
    from playwright.sync_api import sync_playwright

    shots = ROOT / "runs" / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-browser"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _run_all(page, lab)
            n_traces = page.evaluate("() => document.querySelector('.js-plotly-plot').data.length")
            errors = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                                   ".filter(e => e.textContent.includes('Traceback')).length")
            page.locator(".js-plotly-plot").first.screenshot(path=str(shots / "01_weight_update_figure.png"))

            # A person's exploration: another transport, a smaller bucket (two steps left of 1 MiB), Run.
            page.locator(".widget-dropdown select").select_option("distributed")
            handle = page.locator(".widget-hslider .noUi-handle").first
            handle.focus()
            handle.press("ArrowLeft")
            handle.press("ArrowLeft")
            page.wait_for_function("() => document.querySelector('.widget-hslider .widget-readout')"
                                   ".textContent.includes('0.25')", timeout=30_000)
            _press_run(page, run=1)
            first = page.evaluate(EXPLORER_X)
            status_1 = page.locator(".widget-html").last.text_content()

            # Two presses in a row on a slower transport: one sync, the second press refused while it runs.
            page.locator(".widget-dropdown select").select_option("per-tensor")
            _press_run(page, run=2, times=2)
            time.sleep(3)  # a doubled or queued second sync would have landed by now
            second = page.evaluate(EXPLORER_X)
            status_2 = page.locator(".widget-html").last.text_content()
            page.screenshot(path=str(shots / "01_weight_update_page.png"), full_page=True)
        finally:
            try:  # the workbench stays up in interactive mode: close it before the server stops the kernel
                page.evaluate(f"() => {KERNEL}.requestExecute({{code: 'explorer.wait(120); wb.close(); "
                              "from labkit.cluster import runtime; runtime.shutdown()'}).done")
            finally:
                browser.close()
    assert n_traces >= 9, n_traces  # eight phases + the wall-total marker
    assert errors == 0, f"a cell raised; see {shots / '01_weight_update_page.png'}"
    assert (shots / "01_weight_update_figure.png").stat().st_size > 10_000
    m = json.loads(lab["metrics"].read_text())  # what the notebook recorded, as a headless run records it
    assert m["sync/verified"] is True and m["rollout/greedy_match"] is True, m
    assert m["sync/transport"] == "colocated" and m["sync/num_buckets"] > 1
    assert m["sync/weight_version"] == m["rollout/weight_version"]
    assert m["baseline/timing/sync/total"] > 0 and m["peer/timing/sync/total"] > 0 and m["timing/sync/total"] > 0
    assert len(first) == 1 and "distributed @ 256 KiB" in first[0], first  # one press, one sync, the new size
    assert "verified=true" in status_1.lower() and "run 1" in status_1, status_1
    assert len(second) == 2 and second[1].startswith("per-tensor"), second  # two presses while busy: one sync
    assert "verified=true" in status_2.lower() and "run 2" in status_2, status_2
    print(f"screenshots: {shots}")
