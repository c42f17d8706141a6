"""faulthandler's C timer as the stall watchdog arms it: it writes the stacks while the interpreter lock is held,
the dump becomes one part of one episode (whether the sender or the watchdog reads it first), and the timer
leaves no trace in a healthy run, in the user's faulthandler or in a forked child."""

from __future__ import annotations

import ctypes
import faulthandler
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from anemoi_profiler.postmortem.native_stacks import NativeStacks
from anemoi_profiler.postmortem.watchdog import Progress, StallWatchdog
from anemoi_profiler.run_files.faulthandler_dump import SEEN_BY, parse_threads, record_wedged
from anemoi_profiler.run_files.layout import faulthandler_path, stall_part_path, stall_path, wedged_dump_path

REPO = Path(__file__).resolve().parents[2]


def wedged_here(seconds: float) -> None:
    """C code that keeps the interpreter lock: no other Python thread runs meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def training_step(seconds: float) -> None:
    wedged_here(seconds)


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[NativeStacks]:
    native = NativeStacks(tmp_path, 0, 1, threading.get_ident())
    assert native.open()
    yield native
    native.close()


def test_a_wedge_is_dumped_and_recorded_once_whoever_reads_it_first(tmp_path: Path, stacks: NativeStacks) -> None:
    stacks.arm(episode=1, timeout_s=0.3, step=7, batches_finished=8)
    training_step(1.0)

    merged = record_wedged(tmp_path, faulthandler_path(tmp_path, 0))  # the sender, while the job is wedged
    assert merged is not None and merged["episode"] == 1 and merged["last_step"] == 7
    [part] = merged["ranks"]
    assert part["phase"] == "forward (training_step)" and part["seen_by"] == SEEN_BY
    assert part["frame"].startswith("wedged_here (test_native_stacks.py:")
    assert merged["summary"].startswith("stalled after step 7: rank 0 in forward (training_step) at wedged_here")
    assert record_wedged(tmp_path, faulthandler_path(tmp_path, 0)) is None  # once

    taken = stacks.wedge()  # the watchdog, once it runs again: the same part of the same episode
    assert taken is not None and taken["episode"] == 1 and taken["frame"] == part["frame"]
    assert taken["stalled_for_s"] == pytest.approx(part["stalled_for_s"])
    assert "wedged_here" in wedged_dump_path(tmp_path, 1, 0).read_text()  # the dump kept beside the part
    assert stacks.wedge() is None  # a fresh file for the next episode, nothing in it
    assert json.loads(stall_part_path(tmp_path, 1, 0).read_text())["frame"] == part["frame"]


def test_a_healthy_run_leaves_no_file_and_the_users_faulthandler_as_it_was(tmp_path: Path) -> None:
    enabled = faulthandler.is_enabled()
    native = NativeStacks(tmp_path, 0, 1, threading.get_ident())
    assert native.open()
    native.arm(episode=1, timeout_s=0.3, step=0, batches_finished=0)
    native.arm(episode=1, timeout_s=0.5, step=1, batches_finished=1)  # the run moved: pushed back
    native.close()
    time.sleep(0.8)  # past both timeouts: the timer was cancelled
    assert not (tmp_path / "postmortem").exists()
    assert faulthandler.is_enabled() == enabled
    native.arm(episode=1, timeout_s=0.1, step=0, batches_finished=0)  # closed: arms nothing
    time.sleep(0.3)
    assert not (tmp_path / "postmortem").exists()


def test_one_session_holds_the_timer_at_a_time(tmp_path: Path) -> None:
    first, second = (NativeStacks(tmp_path / name, 0, 1, threading.get_ident()) for name in ("a", "b"))
    assert first.open()
    assert not second.open()
    first.close()
    assert second.open()
    second.close()


def test_the_watchdog_takes_the_dump_as_the_one_record_of_the_wedge(tmp_path: Path) -> None:
    finished = [0]
    progress = Progress(lambda: finished[0], lambda: 3, lambda: [], lambda: False)
    watchdog = StallWatchdog(tmp_path, 0, 1, 0.5, progress)
    watchdog.start()
    try:
        training_step(3.5)  # the watchdog cannot run; the C timer fires at 0.5 + 2 s
        for _ in range(12):  # steps end again; the watchdog runs again: takes the dump, then sees the run move
            finished[0] += 1
            time.sleep(0.2)
    finally:
        watchdog.stop()
    assert sorted(path.name for path in (tmp_path / "postmortem").glob("stall_*.json")) == ["stall_1.json"]
    [part] = json.loads(stall_path(tmp_path, 1).read_text())["ranks"]
    assert part["seen_by"] == SEEN_BY and part["frame"].startswith("wedged_here (test_native_stacks.py:")
    assert part["resumed_after_s"] is not None and part["last_step"] == 3
    assert not faulthandler_path(tmp_path, 0).exists()  # cancelled and removed at the end


def test_a_forked_child_ends_normally_while_the_timer_is_armed(tmp_path: Path) -> None:
    """CPython's finalization in a child waits for the parent's timer thread: the timer is off around a fork."""
    script = textwrap.dedent(
        f"""
        import ctypes, os, sys, threading
        from pathlib import Path
        from anemoi_profiler.postmortem.native_stacks import NativeStacks
        stacks = NativeStacks(Path({str(tmp_path)!r}), 0, 1, threading.get_ident())
        assert stacks.open()
        stacks.arm(1, 60.0, 0, 0)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: the interpreter's finalization runs
        _, status = os.waitpid(pid, 0)
        stacks.arm(1, 0.2, 0, 0)  # the parent's timer still works
        ctypes.PyDLL(None).usleep(600000)
        print("child", status, "written", stacks.written())
        stacks.close()
        """
    )
    env = {"PYTHONPATH": f"{REPO / 'src'}"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "child 0 written True"


def test_faulthandlers_text_reads_as_threads_outermost_first() -> None:
    text = textwrap.dedent(
        """\
        Timeout (0:00:02)!
        Thread 0x00007f00000000ff (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 324 in wait
          File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

        Current thread 0x00007f0000000100 (most recent call first):
          File "/home/me/train.py", line 42 in training_step
          File "/home/me/train.py", line 7 in <module>
        """
    )
    first, second = parse_threads(text)
    assert first["ident"] == 0x7F00000000FF and [f["function"] for f in first["stack"]] == ["_bootstrap", "wait"]
    assert second["ident"] == 0x7F0000000100
    assert second["stack"][-1] == {"file": "/home/me/train.py", "line": 42, "function": "training_step", "code": ""}
