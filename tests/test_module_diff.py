"""The module diff reads torch.profiler's module events (`nn.Module: <Class>_<k>`) from a run's traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from anemoi_profiler.layout import trace_path
from anemoi_profiler.reports.module_diff import diff, module_times


def python_event(name: str, ts: float, dur: float, own_id: int, parent_id: int) -> dict[str, Any]:
    args = {"Python id": own_id, "Python parent id": parent_id}
    return {"ph": "X", "cat": "python_function", "name": name, "tid": 1, "ts": ts, "dur": dur, "args": args}


def operator(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": ts, "dur": dur}


def write_trace(run_dir: Path, block_us: float) -> Path:
    """Two profiled steps of Net(Sequential(Linear), Block); Block's forward takes `block_us` (us), the rest 1 ms."""
    events: list[dict[str, Any]] = []
    for step in range(2):
        start = step * 10_000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "tid": 1, "ts": start,
                       "dur": 2000 + block_us})  # fmt: skip
        base = 100 * step
        events += [
            python_event("nn.Module: Net_0", start, 1500 + block_us, base + 1, 0),
            python_event("forward", start + 1, 1400 + block_us, base + 2, base + 1),  # a frame between modules
            python_event("nn.Module: Sequential_0", start + 10, 1000, base + 3, base + 2),
            python_event("nn.Module: Linear_0", start + 20, 900, base + 4, base + 3),
            operator("aten::linear", start + 30, 800),
            operator("aten::addmm", start + 40, 700),  # inside aten::linear: not counted again
            python_event("nn.Module: Block_0", start + 1100, block_us, base + 5, base + 2),
            operator("aten::mul", start + 1110, block_us - 20),
        ]
    path = trace_path(run_dir, "train", 0, 0)
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": events}, file)
    return run_dir


def test_modules_by_path_with_self_time_and_their_operators(tmp_path: Path) -> None:
    times = module_times(write_trace(tmp_path / "a", 500))
    assert times is not None and times.steps == 2 and times.step_ms == pytest.approx(2.5)
    assert times.inclusive_ms == pytest.approx(
        {"Net_0": 2.0, "Net_0/Sequential_0": 1.0, "Net_0/Sequential_0/Linear_0": 0.9, "Net_0/Block_0": 0.5}
    )
    assert times.self_ms["Net_0"] == pytest.approx(0.5) and times.self_ms["Net_0/Sequential_0"] == pytest.approx(0.1)
    assert times.operators_ms["Net_0/Sequential_0/Linear_0"] == pytest.approx({"aten::linear": 0.8})
    assert times.operators_ms["Net_0/Block_0"] == pytest.approx({"aten::mul": 0.48})


def test_the_module_that_got_slower_comes_first_not_its_parents(tmp_path: Path) -> None:
    a, b = module_times(write_trace(tmp_path / "a", 500)), module_times(write_trace(tmp_path / "b", 1500))
    assert a is not None and b is not None
    changes = diff(a, b, b.step_ms - a.step_ms)
    first = changes[0]
    assert first.path == "Net_0/Block_0" and first.self_delta_ms == pytest.approx(1.0) and first.share == 1.0
    assert first.operators == [("aten::mul", pytest.approx(1.0))]
    parent = next(change for change in changes if change.path == "Net_0")
    assert parent.inclusive_delta_ms == pytest.approx(1.0) and parent.self_delta_ms == pytest.approx(0.0)


def test_a_run_without_module_events_has_no_module_times(tmp_path: Path) -> None:
    assert module_times(tmp_path) is None
    path = trace_path(tmp_path, "train", 0, 0)
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": [operator("aten::mm", 0, 10)]}, file)
    assert module_times(tmp_path) is None
