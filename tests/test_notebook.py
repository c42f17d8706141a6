"""The HTA example notebook runs from top to bottom on a copy of the fixtures, offline and headless."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from anemoi_profiler import names

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "hta_analysis.ipynb"


def test_hta_notebook_runs_on_a_run_folder(fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sample = fixtures_dir / "traces" / "hta_sampled_2rank"
    window = tmp_path / "run" / "traces" / "train" / "window_0"
    window.mkdir(parents=True)
    for rank in (0, 1):
        shutil.copyfile(sample / f"sampled_rank-{rank}.json.gz", window / f"rank{rank}.pt.trace.json.gz")
    monkeypatch.setenv("ANEMOI_PROFILER_RUN_FOLDER", str(tmp_path / "run"))
    monkeypatch.setenv("ANEMOI_PROFILER_HTA_OUTPUT", str(tmp_path / "hta"))
    # The `python3` kernel spec runs `python` from PATH: make that this interpreter.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()

    outputs = "".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert "ranks: [0, 1]" in outputs
    assert "train/window_0: ranks 0-1" in outputs
    assert names.hta_window("train/window_0", names.hta_rank(0, "comm_comp_overlap_pct")) in outputs
    assert (tmp_path / "hta" / "train" / "window_0" / "summary.json").exists()
