"""Where the time went between two runs, by nn.Module: the profiler windows' traces aligned by module path.

With `profiler.with_stack=true`, torch.profiler records each module's forward as a `python_function` event named
`nn.Module: <Class>_<k>`, with its caller's id: the chain of them is the module's path in the model
(`Sequential_0/SlowBlock_0`), the same in two runs of one model. Each module gets its host time per profiled
step, inclusive and self (less its submodules), and the operators that ran directly in it; the diff ranks modules
by the change of their self time, so the module that got slower comes before the modules that contain it.
The `_<k>` index counts instances per class, so an added module shifts the paths of later ones: the diff aligns
the two trees level by level (children by class name in call order, then leftovers as renames) instead of
matching paths literally, and names a renamed, new or gone module as such.
Training windows of rank 0 only; forward passes only (backward runs in autograd's threads, outside the modules).
Torch-free.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anemoi_profiler.run_files.layout import TRACE_SUFFIX, TRACES_DIR

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
    """Keys in the order of the modules' first call: the children's order that the tree alignment uses."""
    self_ms: dict[str, float] = field(default_factory=dict)
    operators_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per module, the top-level operators that ran in it (not in a submodule), ms per step."""


@dataclass(frozen=True)
class ModuleChange:
    path: str
    """The module's path in B (in A for a module gone in B)."""
    self_delta_ms: float
    inclusive_delta_ms: float
    share: float
    """This module's self change as a share of the change of the profiled step."""
    operators: list[tuple[str, float]]
    """The operators whose time in the module changed most, ms per step."""
    note: str = ""
    """How the module maps to A when not by its path: `renamed from <A path>`, `<A path> in A` (an added module
    shifted its index), `new in B`, `gone in B`."""


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
    change, makes the shares). A module new in B changes by its whole time, one gone in B by minus its time."""
    changes = []
    for path_a, path_b in align(a, b):
        self_delta = b.self_ms.get(path_b or "", 0.0) - a.self_ms.get(path_a or "", 0.0)
        inclusive_delta = b.inclusive_ms.get(path_b or "", 0.0) - a.inclusive_ms.get(path_a or "", 0.0)
        ops_a, ops_b = a.operators_ms.get(path_a or "", {}), b.operators_ms.get(path_b or "", {})
        deltas = {op: ops_b.get(op, 0.0) - ops_a.get(op, 0.0) for op in sorted(set(ops_a) | set(ops_b))}
        top = sorted(deltas.items(), key=lambda item: (-abs(item[1]), item[0]))[:TOP_OPERATORS]  # ties by name
        share = self_delta / total_change_ms if total_change_ms else 0.0
        path = path_b or path_a or ""
        changes.append(ModuleChange(path, self_delta, inclusive_delta, share, top, _note(path_a, path_b)))
    return sorted(changes, key=lambda change: -change.self_delta_ms)


def align(a: ModuleTimes, b: ModuleTimes) -> list[tuple[str | None, str | None]]:
    """Pairs (path in A, path in B) of the same module, None on the side that lacks it. Level by level, the
    children of two matched modules are aligned in call order (a global sequence alignment, so an inserted
    module does not shift its siblings): one class is the best match, the closer in time the better; modules of
    different classes in the same place are a rename (more so with the same subtree shape); the rest are gone in
    B or new in B, with their subtrees."""
    tree_a, tree_b = _Tree(a), _Tree(b)
    pairs: list[tuple[str | None, str | None]] = []
    pending: list[tuple[str, str]] = [("", "")]
    while pending:
        parent_a, parent_b = pending.pop()
        for path_a, path_b in _align_children(tree_a.children(parent_a), tree_b.children(parent_b), tree_a, tree_b):
            if path_a is not None and path_b is not None:
                pairs.append((path_a, path_b))
                pending.append((path_a, path_b))
            elif path_a is not None:
                pairs += [(path, None) for path in [path_a, *tree_a.descendants(path_a)]]
            elif path_b is not None:
                pairs += [(None, path) for path in [path_b, *tree_b.descendants(path_b)]]
    return pairs


class _Tree:
    """A run's module paths as a tree: children in call order, subtree shapes (classes without indices)."""

    def __init__(self, times: ModuleTimes) -> None:
        self.times = times
        self._children: dict[str, list[str]] = {}
        for path in times.inclusive_ms:
            self._children.setdefault(path.rpartition("/")[0], []).append(path)
        self._shapes: dict[str, tuple[Any, ...]] = {}

    def children(self, path: str) -> list[str]:
        return self._children.get(path, [])

    def descendants(self, path: str) -> list[str]:
        return [found for child in self.children(path) for found in (child, *self.descendants(child))]

    def shape(self, path: str) -> tuple[Any, ...]:
        if path not in self._shapes:
            self._shapes[path] = tuple((_class(child), self.shape(child)) for child in self.children(path))
        return self._shapes[path]


def _align_children(
    paths_a: list[str], paths_b: list[str], tree_a: _Tree, tree_b: _Tree
) -> list[tuple[str | None, str | None]]:
    """Needleman-Wunsch over two lists of sibling paths; a gap scores 0, a pair `_pair_score`."""
    rows, cols = len(paths_a), len(paths_b)
    best = [[0.0] * (cols + 1) for _ in range(rows + 1)]
    for i in range(rows - 1, -1, -1):
        for j in range(cols - 1, -1, -1):
            paired = _pair_score(paths_a[i], paths_b[j], tree_a, tree_b) + best[i + 1][j + 1]
            best[i][j] = max(paired, best[i + 1][j], best[i][j + 1])
    pairs: list[tuple[str | None, str | None]] = []
    i = j = 0
    while i < rows and j < cols:  # on a tie, pair the earliest: a rename in place rather than after a new one
        if best[i][j] == _pair_score(paths_a[i], paths_b[j], tree_a, tree_b) + best[i + 1][j + 1]:
            pairs.append((paths_a[i], paths_b[j]))
            i, j = i + 1, j + 1
        elif best[i][j] == best[i + 1][j]:
            pairs.append((paths_a[i], None))
            i += 1
        else:
            pairs.append((None, paths_b[j]))
            j += 1
    return pairs + [(path, None) for path in paths_a[i:]] + [(None, path) for path in paths_b[j:]]


def _pair_score(path_a: str, path_b: str, tree_a: _Tree, tree_b: _Tree) -> float:
    """2 for one class, 1 for a rename of one subtree shape, 0.5 for another rename; less up to half of it as
    their times per step differ (by a factor e or more: the whole half)."""
    ms_a, ms_b = tree_a.times.inclusive_ms[path_a], tree_b.times.inclusive_ms[path_b]
    time_distance = min(1.0, abs(math.log((ms_a + 1e-6) / (ms_b + 1e-6))))
    same_shape = tree_a.shape(path_a) == tree_b.shape(path_b)
    base = 2.0 if _class(path_a) == _class(path_b) else 1.0 if same_shape else 0.5
    return base * (1 - time_distance / 2)


def _class(path: str) -> str:
    """`Net_0/Linear_3` -> `Linear`: torch's `_<k>` counts instances per class, so it shifts when one is added."""
    stem, _, index = path.rpartition("/")[2].rpartition("_")
    return stem if stem and index.isdigit() else path.rpartition("/")[2]


def _note(path_a: str | None, path_b: str | None) -> str:
    if path_a is None:
        return "new in B"
    if path_b is None:
        return "gone in B"
    if path_a == path_b:
        return ""
    renamed = _class(path_a) != _class(path_b)
    return f"renamed from {path_a}" if renamed else f"{path_a} in A"


def _add_window(times: ModuleTimes, events: list[dict[str, Any]]) -> None:
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = {e["name"]: e["dur"] for e in complete if str(e.get("name", "")).startswith(STEP_PREFIX)}
    python = {e["args"]["Python id"]: e for e in complete if e.get("cat") == "python_function" and _has_ids(e)}
    modules = sorted((e for e in python.values() if e["name"].startswith(MODULE_PREFIX)), key=lambda e: e["ts"])
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
