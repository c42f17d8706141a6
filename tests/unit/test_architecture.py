"""The layout rules of docs/architecture.md that import-linter (the contracts in pyproject.toml, run by `make test`)
cannot express: no import cycle at all, modules stay small, the run folder's and the metrics' names are spelled in
one module, and the commands that need no training start without torch when they run."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from anemoi_profiler.run_files import layout
from tests.conftest import FIXTURES

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "anemoi_profiler"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
TESTS = Path(__file__).resolve().parents[1]
SYNTAX_TREES = {path: ast.parse(path.read_text()) for path in [*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")]}
"""Parsed once, at collection, before any test's fit leaves threads running: CPython 3.11's AST constructor can
miscount its recursion depth while other threads run (SystemError, python/cpython#106905)."""


def imported_modules(name: str) -> set[str]:
    """Our modules that `name` imports anywhere: at the top, inside functions and under TYPE_CHECKING."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(SYNTAX_TREES[path]):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            found.update(
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source for alias in node.names
            )
    return {module for module in found if module in MODULES and module != name}


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Between modules, packages' `__init__` included: import-linter's `acyclic_siblings` compares a package's
    children only, so it misses `tracking.uris -> tracking -> tracking.uris`."""
    graph = {name: imported_modules(name) for name in MODULES}
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        for imported in graph[name]:
            if imported in path:
                cycles.append(" -> ".join([*path[path.index(imported) :], imported]))
            elif imported not in done:
                visit(imported, [*path, imported])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not cycles, cycles


def test_run_folder_file_names_are_spelled_only_in_layout() -> None:
    names = {
        value
        for key, value in vars(layout).items()
        if key.isupper() and isinstance(value, str) and "." in value and key != "ARTIFACT_ROOT"
    }
    spelled = []
    for name, path in MODULES.items():
        if name == "anemoi_profiler.run_files.layout":
            continue
        tree = SYNTAX_TREES[path]
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
                spelled.append(f"{name}:{node.lineno} {node.value!r}")
    assert not spelled, spelled


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["summarize", str(FIXTURES / "traces" / "hta_sampled_2rank")],
        ["sync", "no-such-folder"],
        ["report", "no-such-folder"],
    ],
)
def test_commands_that_train_nothing_start_without_torch(argv: list[str]) -> None:
    """At run time, beyond the torch-free contract in pyproject.toml: `--help` imports every command module (those
    of `demo` and `component` import torch when they run, which a static contract cannot tell apart), and the
    third-party packages a command imports are not looked into by import-linter."""
    script = (
        "import sys\n"
        "from anemoi_profiler.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch imported:', 'torch' in sys.modules, 'lightning imported:', 'lightning' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "torch imported: False lightning imported: False" in result.stdout, result.stdout + result.stderr


METRIC_NAME = re.compile(r"(throughput|time|memory|system|summary|hta|window)/[\w{}<>/-]*")


def test_metric_names_are_spelled_only_in_the_names_module() -> None:
    """Writers, readers and tests take metric names from `anemoi_profiler.names` (an f-string's fixed parts too);
    test_metric_names.py alone spells them, to pin the public ones against docs/metrics.md."""
    exempt = {PACKAGE / "names.py", TESTS / "unit" / "test_metric_names.py"}
    spelled = []
    for path in sorted(SYNTAX_TREES):
        if path in exempt:
            continue
        for node in ast.walk(SYNTAX_TREES[path]):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and METRIC_NAME.fullmatch(node.value):
                spelled.append(f"{path.relative_to(PACKAGE.parents[1])}:{node.lineno} {node.value!r}")
    assert not spelled, spelled


def test_reports_read_files_and_never_import_the_profiling_machinery() -> None:
    """reports/ renders what a run folder holds (torch-free, the same later from `anemoi-profiler report`)."""
    machinery = ("profiling", "run", "clock", "postmortem", "distributed", "cluster", "trainer", "callbacks")
    found = {
        f"{name} -> {imported}"
        for name in MODULES
        if name.startswith("anemoi_profiler.reports")
        for imported in imported_modules(name)
        if imported.split(".")[1] in machinery
    }
    assert not found, found


def test_callbacks_add_to_the_report_only_through_summarize() -> None:
    """One path: a callback's sections and `summary/...` values are what its `summarize` returns, which the base
    class hands to the session (work after the release returns its section to `after_release`)."""
    callers = {
        f"{module_name(path)}:{node.lineno}"
        for path, tree in SYNTAX_TREES.items()
        if path.is_relative_to(PACKAGE)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "add_summary"
    }
    assert {caller.split(":")[0] for caller in callers} == {
        "anemoi_profiler.callbacks.base",
        "anemoi_profiler.run.session",
    }, callers
