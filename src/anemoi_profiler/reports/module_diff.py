"""Where the time went between two runs, by nn.Module: the profiler windows' traces aligned by module path.

With `profiler.with_stack=true`, torch.profiler records each module's forward as a `python_function` event named
`nn.Module: <Class>_<k>`, with its caller's id: the chain of them is the module's path in the model
(`Sequential_0/SlowBlock_0`), the same in two runs of one model. Each module gets its host time per profiled
step, inclusive and self (less its submodules), and the operators that ran directly in it; the diff ranks modules
by the change of their self time, so the module that got slower comes before the modules that contain it.
Training windows of rank 0 only; forward passes only (backward runs in autograd's threads, outside the modules).
Torch-free.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..layout import TRACE_SUFFIX, TRACES_DIR

MODULE_PREFIX = "nn.Module: "
STEP_PREFIX = "ProfilerStep#"
TOP_MODULES = 5
TOP_OPERATORS = 3


@dataclass
class ModuleTimes:
    """A run's forward time per profiled step by module path, in ms."""

    steps: int = 0
    step_ms: float = 0.0
    """A profiled step's duration (torch.profiler's `ProfilerStep#<n>` spans); 0 when the traces have none."""
    inclusive_ms: dict[str, float] = field(default_factory=dict)
    self_ms: dict[str, float] = field(default_factory=dict)
    operators_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per module, the top-level operators that ran in it (not in a submodule), ms per step."""


@dataclass(frozen=True)
class ModuleChange:
    path: str
    self_delta_ms: float
    inclusive_delta_ms: float
    share: float
    """This module's self change as a share of the change of the profiled step."""
    operators: list[tuple[str, float]]
    """The operators whose time in the module changed most, ms per step."""


def module_times(run_dir: Path, stage: str = "train", rank: int = 0) -> ModuleTimes | None:
    """The module times of a run folder's traces; None without traces holding module events."""
    files = sorted((Path(run_dir) / TRACES_DIR / stage).glob(f"window_*/rank{rank}{TRACE_SUFFIX}"))
    times = ModuleTimes()
    for path in files:
        try:
            with gzip.open(path, "rt", encoding="utf-8") as file:
                events = json.load(file).get("traceEvents") or []
        except (OSError, ValueError):
            continue
        _add_window(times, events)
    if not times.steps or not times.inclusive_ms:
        return None
    times.step_ms /= times.steps
    for table in (times.inclusive_ms, times.self_ms):
        for key in table:
            table[key] /= times.steps
    for operators in times.operators_ms.values():
        for key in operators:
            operators[key] /= times.steps
    return times


def diff(a: ModuleTimes, b: ModuleTimes, total_change_ms: float) -> list[ModuleChange]:
    """Modules by the change of their self time per step, largest first (`total_change_ms`, the profiled step's
    change, makes the shares)."""
    changes = []
    for path in set(a.inclusive_ms) | set(b.inclusive_ms):
        self_delta = b.self_ms.get(path, 0.0) - a.self_ms.get(path, 0.0)
        inclusive_delta = b.inclusive_ms.get(path, 0.0) - a.inclusive_ms.get(path, 0.0)
        ops_a, ops_b = a.operators_ms.get(path, {}), b.operators_ms.get(path, {})
        deltas = {op: ops_b.get(op, 0.0) - ops_a.get(op, 0.0) for op in set(ops_a) | set(ops_b)}
        top = sorted(deltas.items(), key=lambda item: -abs(item[1]))[:TOP_OPERATORS]
        share = self_delta / total_change_ms if total_change_ms else 0.0
        changes.append(ModuleChange(path, self_delta, inclusive_delta, share, top))
    return sorted(changes, key=lambda change: -change.self_delta_ms)


def _add_window(times: ModuleTimes, events: list[dict[str, Any]]) -> None:
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = {e["name"]: e["dur"] for e in complete if str(e.get("name", "")).startswith(STEP_PREFIX)}
    python = {e["args"]["Python id"]: e for e in complete if e.get("cat") == "python_function" and _has_ids(e)}
    modules = [e for e in python.values() if e["name"].startswith(MODULE_PREFIX)]
    if not modules:
        return
    times.steps += max(1, len(steps))
    times.step_ms += sum(steps.values()) / 1000
    paths = {id(event): _path(event, python) for event in modules}
    children_ms: dict[int, float] = {}
    for event in modules:
        parent = _parent_module(event, python)
        if parent is not None:
            children_ms[id(parent)] = children_ms.get(id(parent), 0.0) + event["dur"] / 1000
    for event in modules:
        path, ms = paths[id(event)], event["dur"] / 1000
        times.inclusive_ms[path] = times.inclusive_ms.get(path, 0.0) + ms
        times.self_ms[path] = times.self_ms.get(path, 0.0) + ms - children_ms.get(id(event), 0.0)
    _attribute_operators(times, complete, modules, paths)


def _attribute_operators(
    times: ModuleTimes, complete: list[dict[str, Any]], modules: list[dict[str, Any]], paths: dict[int, str]
) -> None:
    """Each top-level operator (not inside another) goes to the innermost module span around it on its thread."""
    for thread in {e.get("tid") for e in modules}:
        spans = sorted((e for e in modules if e.get("tid") == thread), key=lambda e: (e["ts"], -e["dur"]))
        operators = [e for e in complete if e.get("cat") == "cpu_op" and e.get("tid") == thread]
        stack: list[dict[str, Any]] = []
        next_span, operator_end = 0, float("-inf")
        for operator in sorted(operators, key=lambda e: (e["ts"], -e["dur"])):
            start = operator["ts"]
            if start < operator_end:
                continue  # inside the previous top-level operator
            operator_end = start + operator["dur"]
            while next_span < len(spans) and spans[next_span]["ts"] <= start:
                _pop_ended(stack, spans[next_span]["ts"])
                stack.append(spans[next_span])
                next_span += 1
            _pop_ended(stack, start)
            if stack:
                table = times.operators_ms.setdefault(paths[id(stack[-1])], {})
                table[operator["name"]] = table.get(operator["name"], 0.0) + operator["dur"] / 1000


def _pop_ended(stack: list[dict[str, Any]], at: float) -> None:
    while stack and stack[-1]["ts"] + stack[-1]["dur"] < at:
        stack.pop()


def _has_ids(event: dict[str, Any]) -> bool:
    return isinstance(event.get("args"), dict) and "Python id" in event["args"]


def _parent_module(event: dict[str, Any], python: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    seen = set()
    parent_id = event["args"].get("Python parent id")
    while parent_id in python and parent_id not in seen:
        seen.add(parent_id)
        parent = python[parent_id]
        if parent["name"].startswith(MODULE_PREFIX):
            return parent
        parent_id = parent["args"].get("Python parent id")
    return None


def _path(event: dict[str, Any], python: dict[int, dict[str, Any]]) -> str:
    names = [event["name"].removeprefix(MODULE_PREFIX)]
    parent = _parent_module(event, python)
    while parent is not None:
        names.append(parent["name"].removeprefix(MODULE_PREFIX))
        parent = _parent_module(parent, python)
    return "/".join(reversed(names))
