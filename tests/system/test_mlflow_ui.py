"""The run page as a user sees it: the demo with a slow dataloader into its embedded sqlite store, a real
`mlflow server` on that store, and the run's overview, model-metrics and system-metrics pages in headless Chromium;
then a run sent to that server, opened from the link the fit prints.

Set ANEMOI_PROFILER_SCREENSHOTS=<folder> to keep the screenshots (docs/img/mlflow_run_page.png is one).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.demo import run_demo
from anemoi_profiler.reports.charts import WIDTH
from anemoi_profiler.tracking.uris import MODEL_TRAINING_VIEW
from tests.helpers.chromium import CHROMIUM, Browser
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer
from tests.helpers.mlflow_server import MlflowServer

SYSTEM_METRICS = (
    "cpu_utilization_percentage", "system_memory_usage_megabytes", "system_memory_usage_percentage",
    "disk_usage_percentage", "disk_usage_megabytes", "disk_available_megabytes", "network_receive_megabytes",
    "network_transmit_megabytes",
)  # fmt: skip
PRINTED_LINK = re.compile(r"then go to http://127\.0\.0\.1:5000(/#/experiments/\d+/runs/\w+)\?" + MODEL_TRAINING_VIEW)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]


def drawn_width(browser: Browser, selector: str, timeout_s: float = 30.0) -> int:
    """The widest loaded image the selector finds (0 while none has loaded)."""
    deadline = time.monotonic() + timeout_s
    widths = f"Math.max(0, ...[...document.querySelectorAll({selector!r})].map(image => image.naturalWidth))"
    while (width := int(browser.evaluate(widths))) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return width


@pytest.fixture
def browser(tmp_path: Path) -> Browser:
    browser = Browser(tmp_path / "profile", height=1200)  # all eight system charts
    yield browser  # type: ignore[misc]
    browser.close()


@pytest.fixture
def server(tmp_path: Path) -> MlflowServer:
    server = MlflowServer(tmp_path / "server", store_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    yield server  # type: ignore[misc]
    server.stop()


def test_the_run_page_shows_the_diagnosis_tags_and_charts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], browser: Browser, server: MlflowServer
) -> None:
    config = ProfilerConfig.load(
        None,
        [f"output_dir={tmp_path / 'out'}", "report.console=false", "log_every_n_steps=10",
         "throughput.warmup_steps=3", "system.interval_s=1"],
    )  # fmt: skip
    run_demo(config, max_steps=40, slow_data=True)
    assert wait_for_mlflow()  # a short fit's run may still be on its way; its link is printed once it is there
    printed = capsys.readouterr().out
    found = PRINTED_LINK.search(printed)
    assert found, printed
    server.start()
    run_page = server.uri + found[1]

    # MLflow 3.17 takes the view from the URL (else the browser's last choice, GenAI at first), not from the
    # experiment's mlflow.experimentKind tag: without the parameter a first visit lands in the GenAI view.
    browser.open(run_page)
    assert "Evaluations" in browser.wait_for_text("Description", "Evaluation runs")

    browser.open(f"{run_page}?{MODEL_TRAINING_VIEW}")
    text = browser.wait_for_text("anemoi-profiler: what limits this run", "profiler.verdict")
    assert "Evaluations" not in text and "Model training" in text
    # The page shows the run's verdict (which one depends on how busy the machine is: a loaded CPU slows the steps,
    # not the slow loader's sleeps; the verdicts themselves: tests/unit/test_diagnosis.py, test_data_wait.py).
    verdict = MlflowClient(server.uri).get_run(found[1].rsplit("/", 1)[-1]).data.tags["profiler.verdict"]
    assert verdict in text, verdict
    for tag in ("profiler.device", "profiler.world_size", "profiler.strategy", "profiler.precision"):
        assert tag in text, tag
    browser.click('[data-component-id="mlflow.assistant.chat_panel.close"]')  # the assistant panel, if shown
    assert browser.click("button", "Show more")
    text = browser.wait_for_text("Steady state: the steps", "profiler/report.html", "Not assessed")
    assert "<!--" not in text  # the section markers stay invisible
    screenshots = [browser.screenshot(tmp_path / "mlflow_run_page.png", height=760)]

    browser.open(f"{run_page}/model-metrics?{MODEL_TRAINING_VIEW}")
    browser.wait_for_count("svg.main-svg", 2)  # Plotly drew the charts in view
    browser.wait_for_text("(memory/cpu_rss_mb)", "(summary/memory/cpu_rss_mb)")  # their legends
    browser.open(f"{run_page}/system-metrics?{MODEL_TRAINING_VIEW}")
    # One node: no cluster to summarise and no copies of its series: the tab opens on MLflow's own system charts.
    browser.wait_for_count("svg.main-svg", len(SYSTEM_METRICS))
    text = browser.wait_for_text(*(f"(system/{name})" for name in SYSTEM_METRICS))  # each chart's legend
    assert names.cluster("cpu_utilization_percentage", "min").rsplit("/", 1)[0] not in text
    screenshots.append(browser.screenshot(tmp_path / "mlflow_system_metrics.png", height=760))

    # The report's plots are SVG files: MLflow's artifact viewer draws each as an image at its own size.
    browser.open(f"{run_page}/artifacts/profiler/plots/throughput.svg?{MODEL_TRAINING_VIEW}")
    browser.wait_for_count("img[src^='blob:']", 1)
    assert drawn_width(browser, "img[src^='blob:']") == WIDTH

    # A run sent to the server prints the server's link: it opens that run in the model-training view.
    train, _ = loaders(n_train=64)
    config = ProfilerConfig.load(
        None,
        [f"output_dir={tmp_path / 'out'}", f"tracking.uri={server.uri}", "tracking.upload_artifacts=false",
         "report.console=false", "system.enabled=false"],
    )  # fmt: skip
    trainer(build_callbacks(config)).fit(TinyRegressor(), train)
    assert wait_for_mlflow()
    served = re.search(rf"open it at ({re.escape(server.uri)}/#/experiments/\d+/runs/\w+\?{MODEL_TRAINING_VIEW})",
                       capsys.readouterr().out)  # fmt: skip
    assert served, "no link printed"
    browser.open(served[1])
    assert "Evaluations" not in browser.wait_for_text("anemoi-profiler: what limits this run", "profiler.device")

    for shot in screenshots:
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size < 300_000
    keep = os.environ.get("ANEMOI_PROFILER_SCREENSHOTS")
    if keep:
        for shot in screenshots:
            shutil.copy(shot, Path(keep) / shot.name)
