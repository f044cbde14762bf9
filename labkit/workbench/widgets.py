"""ipywidgets controls for INTERACTIVE notebook sessions (JupyterLab). Headless runs never build them.

Nothing heavy runs when a control moves: the slider has continuous_update=False and only the Run button
starts a sync. The sync runs on a worker thread, so the kernel keeps answering the controls meanwhile, and a
press while a sync is running is refused (and said so), never a second sync on top of the first: a person who
clicks twice, or clicks again because a big sync looks stuck, gets one sync.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from labkit.config import choices
from labkit.sync.config import SyncConfig
from labkit.workbench import viz


def sync_explorer(wb, transports: tuple[str, ...] | None = None,
                  sizes_mb=(0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 16.0, 64.0), value_mb: float = 1.0):
    """Transport dropdown + bucket-size slider + Run button; each run adds a bar to a per-phase timing figure.
    `transports` None: every transport `SyncConfig` allows, its default first.

    Returns a namespace: `runs` (each run's metrics, growing as the button is pressed), the controls
    (`transport`, `bucket`, `button`, `status`), `ui` (the box on screen), `state.refused` (presses refused
    while a sync ran) and `wait()` (until the sync in flight is done).
    """
    import ipywidgets as W
    from IPython.display import display

    transport, bucket, run, status, out = _controls(transports, sizes_mb, value_mb)
    runs: list[dict] = []
    busy = threading.Lock()
    state = SimpleNamespace(refused=0, worker=None)

    def work(cfg: SyncConfig) -> None:
        try:
            m = wb.sync(cfg)
            runs.append(m)
            # The figure first, then the status naming the run: "run N" never shows above a figure of N-1 runs.
            out.outputs = (_display_data(viz.sync_phases(runs, title="Sync time per phase (interactive runs)")),)
            status.value = _status(m, len(runs))
        except Exception as e:  # show the error next to the controls; the kernel and engine keep running
            status.value = f"<span style='color:#c00'>{type(e).__name__}: {e}</span>"
        finally:
            run.disabled = False
            busy.release()

    def on_run(_):
        if not busy.acquire(blocking=False):
            state.refused += 1
            status.value = f"{status.value} &middot; <b>a sync is running: press ignored</b>"
            return
        run.disabled = True
        try:
            cfg = SyncConfig(transport=transport.value, bucket_mb=bucket.value, progress=False)
        except Exception:
            run.disabled = False
            busy.release()
            raise
        status.value = f"syncing ({transport.value}, {bucket.value:g} MiB)..."
        state.worker = threading.Thread(target=work, args=(cfg,), name="labkit-sync-explorer", daemon=True)
        state.worker.start()

    def wait(timeout: float | None = None) -> None:
        """Until the sync in flight (if any) has finished: for scripts, and before closing the workbench."""
        if state.worker is not None:
            state.worker.join(timeout)

    run.on_click(on_run)
    ui = W.VBox([W.HBox([transport, bucket, run]), status, out])
    display(ui)
    return SimpleNamespace(ui=ui, runs=runs, transport=transport, bucket=bucket, button=run, status=status,
                           state=state, wait=wait)


def _controls(transports: tuple[str, ...] | None, sizes_mb, value_mb: float) -> tuple:
    """(transport dropdown, bucket slider, Run button, status line, figure output) of the sync explorer."""
    import ipywidgets as W

    if transports is None:
        first = SyncConfig().transport
        transports = (first, *(t for t in choices(SyncConfig, "transport") if t != first))
    sizes = sorted(sizes_mb)
    value = min(sizes, key=lambda s: abs(s - value_mb))
    transport = W.Dropdown(options=list(transports), description="transport")
    bucket = W.SelectionSlider(options=[(f"{s:g} MiB", s) for s in sizes], value=value, description="bucket",
                               continuous_update=False)
    run = W.Button(description="Run sync", button_style="primary", icon="play")
    status = W.HTML("press <b>Run sync</b>: trainer &rarr; engine with these settings, then verify")
    return transport, bucket, run, status, W.Output()


def _status(m: dict, n: int) -> str:
    return (f"verified={m['sync/verified']} &middot; total {m['timing/sync/total']:.3f} s &middot; "
            f"{m['sync/num_buckets']} buckets &middot; version {m['sync/weight_version']} &middot; run {n}")


def _display_data(fig) -> dict:
    """The figure as an Output widget's display_data, built here: from a worker thread, `with out:` captures
    nothing (it hooks the main thread's display) and `append_display_data` gets an empty bundle from plotly's
    renderer, so the browser drew no figure."""
    return {"output_type": "display_data", "metadata": {},
            "data": {"application/vnd.plotly.v1+json": {**json.loads(fig.to_json()), "config": {}},
                     "text/plain": f"<Figure: {fig.layout.title.text}>"}}
