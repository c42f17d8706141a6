"""`profiler.traces: flagged`: only rank 0 and the ranks whose window summary stands out keep their traces."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from anemoi_profiler.cluster.flagged_traces import FLAG_FIELDS, flagged_ranks, keeps_trace, settle_held_traces
from anemoi_profiler.profiling.window_summary import FIELD_NAMES, VECTOR_LENGTH
from anemoi_profiler.profiling.window_table import WindowTable
from anemoi_profiler.run_files.layout import HELD_SUFFIX, trace_path, window_summary_path
from tests.helpers.jobs import FAST, SMALL_WINDOWS, job_command, only_run_folder, run_ok


def table_of(idle_pct: list[float]) -> WindowTable:
    vectors = np.full((len(idle_pct), VECTOR_LENGTH), math.nan)
    vectors[:, FIELD_NAMES.index("idle_pct")] = idle_pct
    return WindowTable(list(range(len(idle_pct))), vectors, {})


def test_rank_0_the_argmax_and_the_far_from_median_are_flagged() -> None:
    # median 21: rank 4 (argmax, 39 points above) and rank 1 (12 points below) stand out; rank 2 is 9 away
    assert flagged_ranks(table_of([20.0, 9.0, 30.0, 21.0, 60.0]), distance_pct=10.0) == {0, 1, 4}
    assert flagged_ranks(table_of([20.0, 9.0, 30.0, 21.0, 60.0]), distance_pct=50.0) == {0, 4}
    assert flagged_ranks(table_of([math.nan] * 3), distance_pct=10.0) == {0}  # nothing assessed: rank 0 only


def test_held_traces_are_renamed_where_flagged_and_deleted_elsewhere(tmp_path: Path) -> None:
    table = table_of([20.0, 60.0, 21.0])
    assert [keeps_trace(table, rank, 10.0) for rank in (0, 1, 2, 3)] == [True, True, False, True]  # 3: no row
    for rank in (1, 2):
        for window in (0, 1):
            held = trace_path(tmp_path, "train", window, rank)
            held = held.with_name(held.name + HELD_SUFFIX)
            held.parent.mkdir(parents=True, exist_ok=True)
            held.write_bytes(b"trace")
    # window 0 exchanged during the run; window 1 not yet: its traces stay held until the final call keeps them
    for rank in (1, 2):
        settle_held_traces(tmp_path, rank, {("train", 0): keeps_trace(table, rank, 10.0)}, final=False)
    assert len(list(tmp_path.rglob(f"*{HELD_SUFFIX}"))) == 2
    settle_held_traces(tmp_path, 1, {("train", 0): True}, final=True)
    settle_held_traces(tmp_path, 2, {("train", 0): False}, final=True)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == [
        "traces/train/window_0/rank1.pt.trace.json.gz",
        "traces/train/window_1/rank1.pt.trace.json.gz",
        "traces/train/window_1/rank2.pt.trace.json.gz",
    ]


@pytest.mark.slow
def test_two_gloo_ranks_with_flagged_traces_write_only_the_flagged_ranks_files(tmp_path: Path) -> None:
    output_dir = tmp_path / "runs"
    overrides = [*FAST, *SMALL_WINDOWS, "profiler.traces=flagged", "profiler.flag_distance_pct=1000"]
    run_ok(job_command("--devices=2", f"--output-dir={output_dir}", *overrides), tmp_path)
    run_dir = only_run_folder(output_dir)
    for window in (0, 1):
        with window_summary_path(run_dir, "train", window, ".csv").open() as file:
            rows = {int(row["rank"]): row for row in csv.DictReader(file)}
        assert sorted(rows) == [0, 1]  # both ranks keep their summary
        # CPU-only: only host_collective_pct is assessed; its argmax and rank 0 keep their traces
        values = [float(rows[rank]["host_collective_pct"]) for rank in (0, 1)]
        assert all(rows[rank][field] == "" for rank in (0, 1) for field in FLAG_FIELDS[:2])
        expected = {0, int(np.argmax(values))}
        folder = trace_path(run_dir, "train", window, 0).parent
        assert {int(p.name[4]) for p in folder.glob("rank*")} == expected
        assert not list(folder.glob(f"*{HELD_SUFFIX}"))
