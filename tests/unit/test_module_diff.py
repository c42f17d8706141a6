"""The module diff reads torch.profiler's module events (`nn.Module: <Class>_<k>`) from a run's traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from anemoi_profiler.reports.module_diff import ModuleTimes, diff, module_times
from anemoi_profiler.run_files.layout import trace_path


def python_event(name: str, ts: float, dur: float, own_id: int, parent_id: int) -> dict[str, Any]:
    args = {"Python id": own_id, "Python parent id": parent_id}
    return {"ph": "X", "cat": "python_function", "name": name, "tid": 1, "ts": ts, "dur": dur, "args": args}


def operator(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": ts, "dur": dur}


def write_trace(run_dir: Path, block_us: float, block: str = "Block") -> Path:
    """Two profiled steps of Net(Sequential(Linear), <block>); its forward takes `block_us` (us), the rest 1 ms."""
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
            python_event(f"nn.Module: {block}_0", start + 1100, block_us, base + 5, base + 2),
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


def tree(self_ms: dict[str, float]) -> ModuleTimes:
    """Module times from each path's self ms per step, in call order; each module runs one `aten::<class>`."""
    inclusive = {path: sum(ms for other, ms in self_ms.items() if other == path or other.startswith(path + "/"))
                 for path in self_ms}  # fmt: skip
    operators = {
        path: {f"aten::{path.rpartition('/')[2].rpartition('_')[0].lower()}": ms} for path, ms in self_ms.items()
    }
    return ModuleTimes(1, inclusive["Net_0"], inclusive, dict(self_ms), operators)


BASE = {"Net_0": 0.1, "Net_0/Linear_0": 1.0, "Net_0/Block_0": 0.2, "Net_0/Block_0/Linear_1": 2.0, "Net_0/Linear_2": 4.0}


def by_path(a: ModuleTimes, b: ModuleTimes) -> dict[str, Any]:
    return {change.path: change for change in diff(a, b, b.inclusive_ms["Net_0"] - a.inclusive_ms["Net_0"])}


def test_an_inserted_module_does_not_shift_its_siblings_comparisons() -> None:
    """A Linear inserted first renumbers every later Linear (`Linear_2` -> `Linear_3`): each still meets its own."""
    b = tree({"Net_0": 0.1, "Net_0/Linear_0": 0.5, "Net_0/Linear_1": 1.0, "Net_0/Block_0": 0.2,
              "Net_0/Block_0/Linear_2": 2.0, "Net_0/Linear_3": 4.4})  # fmt: skip
    changes = by_path(tree(BASE), b)
    assert changes["Net_0/Linear_0"].note == "new in B" and changes["Net_0/Linear_0"].self_delta_ms == 0.5
    assert changes["Net_0/Linear_1"].note == "Net_0/Linear_0 in A" and changes["Net_0/Linear_1"].self_delta_ms == 0
    assert changes["Net_0/Block_0/Linear_2"].self_delta_ms == 0
    assert changes["Net_0/Block_0/Linear_2"].note == "Net_0/Block_0/Linear_1 in A"
    last = changes["Net_0/Linear_3"]
    assert last.note == "Net_0/Linear_2 in A" and last.self_delta_ms == pytest.approx(0.4)
    assert last.operators == [("aten::linear", pytest.approx(0.4))]
    assert len(changes) == 6 and changes["Net_0/Block_0"].note == ""


def test_a_renamed_class_is_matched_with_its_subtree() -> None:
    b = tree({"Net_0": 0.1, "Net_0/Linear_0": 1.0, "Net_0/FastBlock_0": 0.2, "Net_0/FastBlock_0/Linear_1": 1.5,
              "Net_0/Linear_2": 4.0})  # fmt: skip
    changes = by_path(tree(BASE), b)
    assert set(changes) == {"Net_0", "Net_0/Linear_0", "Net_0/FastBlock_0", "Net_0/FastBlock_0/Linear_1",
                            "Net_0/Linear_2"}  # fmt: skip
    renamed = changes["Net_0/FastBlock_0"]
    assert renamed.note == "renamed from Net_0/Block_0" and renamed.inclusive_delta_ms == pytest.approx(-0.5)
    inner = changes["Net_0/FastBlock_0/Linear_1"]
    assert inner.note == "Net_0/Block_0/Linear_1 in A" and inner.self_delta_ms == pytest.approx(-0.5)
    assert inner.share == pytest.approx(1.0)


def test_a_new_module_is_reported_as_new_with_its_whole_time_as_the_change() -> None:
    """A module of a new class between two siblings, with a submodule: new in B, self and inclusive time as
    the change; nothing is renamed and the siblings still meet their own."""
    b = tree({"Net_0": 0.1, "Net_0/Linear_0": 1.0, "Net_0/Gate_0": 0.3, "Net_0/Gate_0/Sigmoid_0": 0.7,
              "Net_0/Block_0": 0.2, "Net_0/Block_0/Linear_1": 2.0, "Net_0/Linear_2": 4.0})  # fmt: skip
    changes = diff(tree(BASE), b, 1.0)
    assert [(c.path, c.note) for c in changes[:2]] == [("Net_0/Gate_0/Sigmoid_0", "new in B"),
                                                       ("Net_0/Gate_0", "new in B")]  # fmt: skip
    gate = changes[1]
    assert gate.self_delta_ms == pytest.approx(0.3) and gate.inclusive_delta_ms == pytest.approx(1.0)
    assert gate.share == pytest.approx(0.3) and gate.operators == [("aten::gate", pytest.approx(0.3))]
    assert all(c.note == "" and c.self_delta_ms == 0 for c in changes[2:])


def test_a_module_gone_in_b_counts_minus_its_time() -> None:
    b = tree({"Net_0": 0.1, "Net_0/Linear_0": 1.0, "Net_0/Linear_1": 4.0})
    changes = by_path(tree(BASE), b)
    assert changes["Net_0/Block_0"].note == "gone in B" and changes["Net_0/Block_0"].inclusive_delta_ms == -2.2
    assert changes["Net_0/Block_0/Linear_1"].note == "gone in B"
    assert changes["Net_0/Linear_1"].note == "Net_0/Linear_2 in A" and changes["Net_0/Linear_1"].self_delta_ms == 0


def test_a_renamed_module_in_real_trace_events_is_matched_and_named(tmp_path: Path) -> None:
    a = module_times(write_trace(tmp_path / "a", 500))
    b = module_times(write_trace(tmp_path / "b", 1500, block="FastBlock"))
    assert a is not None and b is not None
    first = diff(a, b, b.step_ms - a.step_ms)[0]
    assert (first.path, first.note) == ("Net_0/FastBlock_0", "renamed from Net_0/Block_0")
    assert first.self_delta_ms == pytest.approx(1.0) and first.operators == [("aten::mul", pytest.approx(1.0))]
