"""The end of a run reads its run folder once and diagnoses it once: report.txt/json, report.html, the MLflow
run's verdict tag and description all show that one diagnosis, the same that `anemoi-profiler report` gives
later from the files. On a real CPU fit with torch.profiler windows, the model summary and a real sqlite store."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, wait_for_mlflow
from anemoi_profiler.callbacks import ProfilerCallback
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.reports import diagnosis, run_data
from anemoi_profiler.run.run_page import verdict_tag
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer


def count_calls(monkeypatch: pytest.MonkeyPatch, function: Callable[..., Any], calls: Counter[str]) -> None:
    """Wrap `function` with a counter wherever the package holds it (its module and every `from ... import`),
    so that a caller anywhere is counted; the real function still runs."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[function.__name__] += 1
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("anemoi_profiler") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, counted)


@pytest.mark.slow  # a detailed fit with windows and a real MLflow sender: about 30 s on 2 busy cores
@pytest.mark.stack
def test_the_run_end_reads_the_folder_once_and_every_report_shows_one_diagnosis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ProfilerConfig.load(
        "detailed",
        [f"output_dir={tmp_path / 'runs'}", "report.console=false", "system.interval_s=0.5", "log_every_n_steps=4",
         "throughput.warmup_steps=2", "profiler.train.skip_first=2", "profiler.train.wait=0",
         "profiler.train.warmup=1", "profiler.train.active=2", "hta.enabled=false"],
    )  # fmt: skip
    callbacks = build_callbacks(config)  # the sender starts early, as in a user's script
    calls: Counter[str] = Counter()
    count_calls(monkeypatch, run_data.load_run, calls)
    count_calls(monkeypatch, diagnosis.assess, calls)
    train, val = loaders(n_train=192, n_val=32)
    trainer(callbacks, limit_val_batches=2).fit(TinyRegressor(), train, val)

    assert calls == {"load_run": 1, "assess": 1}
    (folder,) = run_folders(tmp_path / "runs")
    assert {"report.txt", "report.json", "report.html", "model_summary.txt"} <= {p.name for p in folder.iterdir()}
    written = json.loads((folder / "report.json").read_text())["sections"][diagnosis.TITLE]["data"]
    later = run_data.load_run(folder)  # what `anemoi-profiler report` reads a week later
    outcomes = diagnosis.assess(later)
    assert diagnosis.render_section(outcomes).data == written
    wait_for_mlflow()
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.data.tags["profiler.verdict"] == verdict_tag(outcomes)
    description = run.data.tags["mlflow.note.content"]
    for name in written["not_assessed"]:
        assert name in description and name in (folder / "report.html").read_text()


class OldFormSummary(ProfilerCallback):
    """A callback written for the earlier contract: one section, not a list."""

    def summarize(self, trainer: Any) -> Any:
        return ReportSection.key_values("Gradients", {"largest norm": (1.0, "")}), {}


def test_a_summarize_that_returns_no_list_is_named_and_the_fit_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ProfilerConfig.load(
        None, [f"output_dir={tmp_path}", "tracking.enabled=false", "report.console=false", "system.enabled=false"]
    )
    train, _ = loaders(n_train=64)
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        trainer([OldFormSummary(config)], limit_val_batches=0).fit(TinyRegressor(), train)
    assert (
        "OldFormSummary could not summarize: summarize returned ReportSection, expected a list of ReportSection"
        in caplog.text
    )
    (folder,) = run_folders(tmp_path)
    assert "Diagnosis" in json.loads((folder / "report.json").read_text())["sections"]  # the report is written
