"""The curves as users see them: the MLflow UI's chart of ``val_loss`` in headless Chromium.

A 2-rank training logs to the session's real ``mlflow server``; Debian's ``chromium`` (driven through
Playwright, no browser download, no network beyond 127.0.0.1) opens the run's "Model metrics" page, and the
test reads the ``val_loss`` chart from the page itself: the data of the Plotly chart the UI drew and the point
markers in its SVG. One point per epoch, at steps 0..E-1, with the global values (the mean of the ranks' own
Keras values: equal shards). The screenshot is kept in test-artifacts/ (docs/mlflow-ui.png is one).
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from tests.conftest import ARTIFACTS
from tests.support import launch

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.browser, pytest.mark.timeout(600)]

EPOCHS = 5
CLOSED_NETWORK = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
]
# Every chart on the page: its card title (first line of the nearest titled ancestor), its traces, its markers.
READ_CHARTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(plot => {
  let title = '', node = plot;
  for (let i = 0; i < 8 && node && !title; i++) {
    node = node.parentElement;
    const first = (node && node.innerText || '').trim().split('\\n')[0];
    if (first && isNaN(Number(first))) title = first;
  }
  return {
    title,
    traces: (plot.data || []).map(t => ({x: Array.from(t.x || []), y: Array.from(t.y || [])})),
    markers: plot.querySelectorAll('.scatterlayer .trace .points path').length,
  };
})"""


def test_val_loss_chart_has_one_point_per_epoch(tmp_path, mlflow_server):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: scripts/test.sh installs it (apt-get install chromium)"
    done = launch.run(tmp_path, ["--epochs", str(EPOCHS)], env={"MLFLOW_TRACKING_URI": mlflow_server.url}).check()
    ranks = [done.rank(0), done.rank(1)]
    run_id = ranks[0]["run_id"]
    want = [float(np.mean([r["local"][e]["val_loss"] for r in ranks])) for e in range(EPOCHS)]

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CLOSED_NETWORK)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            outside = []
            page.on("request", lambda r: outside.append(r.url) if "127.0.0.1" not in r.url else None)
            page.goto(f"{mlflow_server.url}/#/experiments/0/runs/{run_id}/model-metrics")
            drawn = f"() => ({READ_CHARTS})().some(c => c.title === 'val_loss' && c.markers > 0)"
            page.wait_for_function(drawn, timeout=90_000)
            page.wait_for_timeout(1000)  # let every chart finish drawing
            charts = page.evaluate(READ_CHARTS)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "mlflow-ui-model-metrics.png"))
        finally:
            browser.close()

    by_title = {chart["title"]: chart for chart in charts}
    assert "val_loss" in by_title, sorted(by_title)
    chart = by_title["val_loss"]
    assert chart["traces"], chart
    for trace in chart["traces"]:  # the UI draws a line trace and a marker trace of the same points
        assert trace["x"] == list(range(EPOCHS))  # one point per epoch, no repeated step
        assert trace["y"] == pytest.approx(want, rel=1e-6)  # the global values
    assert chart["markers"] == EPOCHS  # what is drawn: one marker per epoch
    assert not [u for u in outside if not u.startswith(("data:", "blob:", "about:"))], outside[:5]


def test_a_diverged_run_shows_its_tag_and_spread_curve(tmp_path, mlflow_server, client):
    """What docs/training-dynamics.md shows: ranks that train different models (Keras 3: Horovod's
    DistributedOptimizer does not average; else no initial broadcast), the run's tag and its spread chart."""
    from playwright.sync_api import sync_playwright

    from tests.multirank.test_divergence import WORKER, keras3

    scenario = "horovod-optimizer" if keras3() else "no-broadcast"
    experiment = f"diverged-{tmp_path.name}"
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": experiment}
    launch.run(tmp_path, ["--scenarios", scenario, "--epochs", str(EPOCHS)], worker=WORKER, env=env).check()
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    (run,) = client.search_runs([experiment_id])
    spread = sorted(client.get_metric_history(run.info.run_id, "weights_rank_spread"), key=lambda m: m.step)
    base = f"{mlflow_server.url}/#/experiments/{experiment_id}/runs/{run.info.run_id}"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CLOSED_NETWORK)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(base)
            page.wait_for_function("() => document.body.innerText.includes('hvd_mlflow.diverged_at_epoch')",
                                   timeout=90_000)  # fmt: skip
            overview = page.evaluate("() => document.body.innerText")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "mlflow-ui-diverged-tag.png"))
            page.goto(f"{base}/model-metrics")
            drawn = f"() => ({READ_CHARTS})().some(c => c.title === 'weights_rank_spread' && c.markers > 0)"
            page.wait_for_function(drawn, timeout=90_000)
            page.wait_for_timeout(1000)
            charts = {c["title"]: c for c in page.evaluate(READ_CHARTS)}
            page.screenshot(path=str(ARTIFACTS / "mlflow-ui-diverged-spread.png"))
        finally:
            browser.close()

    shown = re.search(r"hvd_mlflow\.diverged_at_epoch\s*:?\s*(\S+)", overview)  # the tag's key, then its value
    assert shown is not None and shown[1] == "0", overview[overview.index("hvd_mlflow.diverged_at_epoch") :][:80]
    chart = charts["weights_rank_spread"]
    assert chart["markers"] == EPOCHS
    for trace in chart["traces"]:
        assert trace["x"] == list(range(EPOCHS))
        assert trace["y"] == pytest.approx([m.value for m in spread], rel=1e-6) and min(trace["y"]) > 1e-5
