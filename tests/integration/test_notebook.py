"""The HTA example notebook runs from top to bottom, offline and headless: on its default input (a GPU trace kept in
the repository) and on a CPU run folder made here, where it says what HTA cannot show and shows the rest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "hta_analysis.ipynb"


def execute(monkeypatch: pytest.MonkeyPatch, hta_output: Path, run_folder: Path | None = None) -> str:
    """Run the notebook where it lies (its default input is relative to it); all its cells' text output."""
    if run_folder is None:
        monkeypatch.delenv("ANEMOI_PROFILER_RUN_FOLDER", raising=False)
    else:
        monkeypatch.setenv("ANEMOI_PROFILER_RUN_FOLDER", str(run_folder))
    monkeypatch.setenv("ANEMOI_PROFILER_HTA_OUTPUT", str(hta_output))
    # The `python3` kernel spec runs `python` from PATH: make that this interpreter.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    return "".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


@pytest.mark.slow
def test_the_notebook_shows_htas_breakdowns_on_its_default_gpu_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = execute(monkeypatch, tmp_path / "hta")

    assert "No run files here" in outputs  # a folder of traces only
    assert "ranks: [0, 1]" in outputs and "no GPU kernels" not in outputs
    assert "sum (us)" in outputs  # HTA's kernel breakdown
    assert "== train/window_0 (2 rank(s))" in outputs  # the window summary from the traces
    assert "train/window_0: ranks 0-1" in outputs
    assert names.hta_window("train/window_0", names.hta_rank(0, "comm_comp_overlap_pct")) in outputs
    assert (tmp_path / "hta" / "train" / "window_0" / "summary.json").exists()


@pytest.mark.slow
def test_the_notebook_on_a_cpu_run_says_what_it_cannot_show_and_shows_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ProfilerConfig.load(
        "detailed",
        [f"output_dir={tmp_path / 'runs'}", "tracking.enabled=false", "report.console=false", "hta.enabled=false"],
    )
    train, val = loaders(n_train=16 * 40)
    trainer(build_callbacks(config), max_steps=40, limit_val_batches=2).fit(TinyRegressor(), train, val)
    (run_dir,) = run_folders(tmp_path / "runs")

    outputs = execute(monkeypatch, tmp_path / "hta", run_dir)

    assert "These traces hold no GPU kernels (a CPU run)" in outputs
    assert "Skipped: no GPU kernels in these traces." in outputs
    assert "training samples/s:" in outputs  # the run's steady figures
    assert "40 steps, " in outputs and "steady: median" in outputs  # each step's time
    assert "== train/window_0" in outputs  # the window summary
    assert "self_cpu_ms" in outputs  # the time report
    assert "sum (us)" not in outputs
