"""What a first run prints reads well: a command that runs from any shell, whole diagnosis lines, no empty
pointers (issue 53)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from anemoi_profiler import names
from anemoi_profiler.analysis.summary_text import format_summary
from anemoi_profiler.report_sections import ReportSection, RunReport
from anemoi_profiler.reports import steady
from anemoi_profiler.run.folder import mlflow_command


def test_the_printed_mlflow_command_runs_from_a_shell_without_the_virtual_environment() -> None:
    executable = shlex.split(mlflow_command())
    assert Path(executable[0]).is_absolute() and os.access(executable[0], os.X_OK)
    bare = {"PATH": "/usr/bin:/bin", "MLFLOW_DISABLE_TELEMETRY": "true"}
    result = subprocess.run(
        [*executable, "ui", "--help"], env=bare, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "--backend-store-uri" in result.stdout


def test_the_diagnosis_is_not_folded_on_a_narrow_console(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    sentence = "[high] dataloader-bound: 45% of the training step waits for the dataloader (12.0 of 26.7 ms)"
    report = RunReport({"status": "FINISHED"})
    report.add(ReportSection("Diagnosis", [""], [[sentence], ["    Next: raise num_workers"]], note="Checked: all."))
    report.print_console()
    lines = capsys.readouterr().out.splitlines()
    assert sentence in lines  # whole, its severity too (not read as rich markup)
    assert "    Next: raise num_workers" in lines


def window_summary(tables: list[str]) -> dict[str, object]:
    return {
        "window": "train/window_0",
        "folder": "traces/train/window_0",
        "out_dir": "results/train/window_0",
        "ranks": [0],
        "metrics": {},
        "top_kernels": [],
        "ran": [],
        "skipped": {"temporal_breakdown": "no GPU kernels"},
        "failed": {},
        "warnings": [],
        "tables": tables,
    }


def test_analyze_points_at_the_tables_only_where_there_are_some() -> None:
    assert "tables:" not in format_summary(window_summary([]))  # a CPU run: every analysis skipped
    assert "  tables: results/train/window_0" in format_summary(window_summary(["temporal_breakdown"]))


FIGURES = [names.throughput("train", name) for name in ("samples_per_sec", "batches_per_sec", "items_per_sec", "mfu")]
FIGURES += [names.timing("train", name) for name in ("step_ms", "step_ms_min", "step_ms_max", "loop_ms")]


def test_the_steady_figures_keep_their_order_in_runs_of_any_hash_seed() -> None:
    """Two runs (processes of different hash seeds) give the report's rows in one order, the figures' own."""
    code = (
        "import sys; from anemoi_profiler.reports import steady; log = steady.IntervalLog(); "
        "log.append(10, 5, 1.0, dict.fromkeys(sys.argv[1:], 1.0)); "
        "log.append(20, 5, 1.0, dict.fromkeys(sys.argv[1:], 2.0)); "
        "print(' '.join(steady.combined(steady.split(log.intervals()).steady)))"
    )
    orders = set()
    for seed in ("1", "2", "3"):
        environment = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", code, *FIGURES], env=environment, capture_output=True, text=True, check=True
        )
        orders.add(tuple(result.stdout.split()))
    assert orders == {tuple(FIGURES)}


def test_the_throughput_rows_lead_with_the_headline() -> None:
    made = ["device/batches_per_sec", "device/samples_per_sec", "mfu", "batches_per_sec", "samples_per_sec"]
    rates = dict.fromkeys([names.throughput("train", name) for name in [*made, "items_per_sec"]], 1.0)
    expected = ["samples_per_sec", "items_per_sec", "batches_per_sec", "mfu", "device/samples_per_sec"]
    expected += ["device/batches_per_sec"]
    assert list(steady.headline_first(rates)) == [names.throughput("train", name) for name in expected]
    assert list(steady.headline_first(dict(reversed(rates.items())))) == list(steady.headline_first(rates))


def test_the_demo_says_its_steps_without_a_progress_bar() -> None:
    from anemoi_profiler.demo import ProgressLines

    said: list[str] = []
    progress = ProgressLines(said.append, max_steps=120, every=50)
    for step in range(1, 121):
        progress.on_train_batch_end(SimpleNamespace(global_step=step), None, None, None, step - 1)
    assert [line.split(",")[0] for line in said] == ["step 50/120", "step 100/120", "step 120/120"]


def test_the_demo_command_says_each_phase_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from anemoi_profiler.cli import demo_command

    demo_command.say("loading torch and Lightning")
    assert capsys.readouterr().out == "anemoi-profiler: demo: loading torch and Lightning\n"
