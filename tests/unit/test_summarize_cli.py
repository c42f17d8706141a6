"""`anemoi-profiler summarize` over the shared trace fixtures, as a user runs it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from anemoi_profiler.cli.main import main
from anemoi_profiler.run_files.layout import CONFIG_FILE, ENVIRONMENT_FILE, trace_path

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


def test_summarize_prints_each_ranks_figures_of_a_trace_folder(
    fixtures_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["summarize", str(fixtures_dir / "traces" / "hta_sampled_2rank")]) == 0
    out = capsys.readouterr().out
    assert "(2 ranks)" in out and "rank 0" in out and "rank 1" in out
    idle = next(line for line in out.splitlines() if line.startswith("idle_pct "))
    assert idle.split()[1:] == ["55.21", "52.89"]  # HTA's idle_time_pctg of the same traces
    assert "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" in out


def test_summarize_json_of_a_run_folder_has_every_window(
    fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    run_dir = tmp_path / "20260101-000000_0123abcd"
    run_dir.mkdir()
    (run_dir / CONFIG_FILE).write_text("profiler: {}\n")
    (run_dir / ENVIRONMENT_FILE).write_text("{}")
    source = fixtures_dir / "traces"
    for window, (folder, name) in enumerate(
        [("h200_single_gpu", "rank-0.pt.trace.json.gz"), ("cpu_only", "rank-34.pt.trace.json.gz")]
    ):
        target = trace_path(run_dir, "train", window, 0)
        target.parent.mkdir(parents=True)
        shutil.copyfile(source / folder / name, target)
    assert main(["summarize", str(run_dir), "--json"]) == 0
    windows = json.loads(capsys.readouterr().out)
    assert sorted(windows) == ["train/window_0", "train/window_1"]
    gpu = windows["train/window_0"]["ranks"][0]
    assert gpu["steps"] == 3 and gpu["idle_pct"] == pytest.approx(53.29, abs=0.01)
    assert gpu["top_kernels"][0]["name"].startswith("nvjet_sm90")
    cpu = windows["train/window_1"]["ranks"][0]
    assert cpu["rank"] == 34 and cpu["idle_pct"] is None and cpu["host_busy_pct"] > 0


def test_summarize_names_a_missing_folder_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summarize", str(tmp_path / "nowhere")]) == 1
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "rank0.json").write_text('{"traceEvents": [')
    assert main(["summarize", str(tmp_path)]) == 1
    assert "cut short" in capsys.readouterr().err


def test_summarize_skips_a_json_file_that_is_no_trace_with_a_line(
    fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HTA's outputs or a user's notes beside the traces: each skipped with a line, the traces still summarised."""
    folder = tmp_path / "traces"
    shutil.copytree(fixtures_dir / "traces" / "hta_sampled_2rank", folder)
    (folder / "notes.json").write_text('{"note": "the run with the new sampler"}')
    (folder / "overlap.json").write_text("[[0, 55.2], [1, 52.9]]")
    assert main(["summarize", str(folder)]) == 0
    captured = capsys.readouterr()
    assert "(2 ranks)" in captured.out
    skipped = [line for line in captured.err.splitlines() if line.startswith("anemoi-profiler summarize: skipping")]
    assert len(skipped) == 2 and "notes.json" in skipped[0] and "overlap.json" in skipped[1]
