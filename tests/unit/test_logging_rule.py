"""The logging rule of `anemoi_profiler.logs`: every log message goes through `get_logger`, which writes the
`anemoi-profiler: ` prefix once; printed lines take the prefix from `logs.PREFIX`. Nothing else spells it."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from anemoi_profiler.callbacks.base import ProfilerCallback, guarded
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.logs import PREFIX

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "anemoi_profiler"
SYNTAX_TREES = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
"""Parsed once, at collection (see test_architecture.py: CPython 3.11's AST constructor and running threads)."""
LEVELS = {"debug", "info", "warning", "warning_once", "error", "exception", "critical", "log"}
LOGGERS = {"log", "logger", "LOGGER", "package_log"}


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"


def leading_text(node: ast.AST) -> str | None:
    """The text a string or an f-string starts with; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    return None


def log_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LEVELS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in LOGGERS
    ]


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of the module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_no_log_call_types_the_prefix() -> None:
    """`log.warning("anemoi-profiler: ...")` through `get_logger` says the prefix twice, through a plain
    `logging.getLogger` it spells it by hand: the message's text starts after the prefix."""
    typed = []
    for path, tree in SYNTAX_TREES.items():
        for call in log_calls(tree):
            level = call.func.attr if isinstance(call.func, ast.Attribute) else ""
            message = call.args[1 if level == "log" else 0] if call.args else None  # `log.log(level, msg)`
            text = leading_text(message) if message is not None else None
            if text is not None and text.startswith(PREFIX.strip()):
                typed.append(where(path, call))
    assert not typed, f"log calls that type the prefix (get_logger adds it): {typed}"


def test_loggers_come_from_get_logger() -> None:
    """A `logging.getLogger(__name__)` logger writes no prefix: the package's lines could not be told apart in
    the training's log. `logs` makes them; the CLI and the sender's child reach the package logger for handlers."""
    allowed = {"logs.py", "cli/main.py", "tracking/sender.py"}
    plain = []
    for path, tree in SYNTAX_TREES.items():
        if str(path.relative_to(PACKAGE).as_posix()) in allowed:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "logging"
            ):
                plain.append(where(path, node))
    assert not plain, f"loggers made without logs.get_logger: {plain}"


def test_the_prefix_is_spelled_only_in_logs() -> None:
    """Printed lines (a command's answers and errors, where a run went) start with `f"{PREFIX}..."`."""
    spelled = []
    for path, tree in SYNTAX_TREES.items():
        if path.name == "logs.py":
            continue
        skipped = docstrings(tree)
        for node in ast.walk(tree):  # an f-string's text parts are string constants too
            text = node.value if isinstance(node, ast.Constant) and id(node) not in skipped else None
            if isinstance(text, str) and text.startswith(PREFIX.strip()):
                spelled.append(where(path, node))
    assert not spelled, f"the prefix spelled outside logs.PREFIX: {sorted(set(spelled))}"


def profiler_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name.startswith("anemoi_profiler")]


def test_a_failed_error_record_says_the_prefix_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`on_exception` records an out-of-memory error in postmortem/; when that fails (here the run folder is a
    file), the callback says so, and the training's own error goes on."""
    callback = ProfilerCallback(ProfilerConfig.load(overrides=["postmortem.flight_recorder=false"]))
    not_a_folder = tmp_path / "run"
    not_a_folder.write_text("")
    callback.session.postmortem.run_dir = not_a_folder
    killed = RuntimeError("DataLoader worker (pid 7) is killed by signal: Killed.")
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        callback.on_exception(None, None, killed)
    said = profiler_messages(caplog)
    assert len(said) == 1, said
    assert said[0].startswith(f"{PREFIX}could not record the error: "), said
    assert said[0].count(PREFIX.strip()) == 1, said


def test_a_failed_hook_says_the_prefix_once(caplog: pytest.LogCaptureFixture) -> None:
    class Failing(ProfilerCallback):
        @guarded
        def on_train_start(self, trainer: object, pl_module: object) -> None:
            raise ValueError("no such metric")

    callback = Failing(ProfilerConfig.load(overrides=["postmortem.flight_recorder=false"]))
    with caplog.at_level(logging.WARNING, logger="anemoi_profiler"):
        callback.on_train_start(None, None)
        callback.on_train_start(None, None)  # disabled now: silent
    said = profiler_messages(caplog)
    assert said == [
        f"{PREFIX}Failing stopped measuring after an error in on_train_start: ValueError: no such metric "
        "(training continues)"
    ]
