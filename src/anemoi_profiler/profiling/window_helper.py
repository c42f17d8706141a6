"""The window summary in a helper process, read from the trace torch exported: the training process's GIL stays free.

Reading a window's events is Python work in proportion to its events (a million for 100 steps of a model of
many small operators). In a thread of the training process it holds the GIL for seconds, and the training
thread waits for it in the steps after the window. The helper (`python -m anemoi_profiler.profiling.
window_helper`, without torch, at a lower CPU priority) reads the window's trace file as the `summarize` command
does (the figures that agree with HTA) and sends the summary back; the summary thread only waits for its reply.
It is started on the summary thread when the first window opens (its interpreter's start-up, a few tenths of a
second of CPU at a lower priority, is then over before the window ends), and it exits when its input closes, so
it never outlives the training process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from anemoi_profiler.profiling.trace_stream import read_window_events
from anemoi_profiler.profiling.window_summary import WindowSummary, summarize

NICENESS = 5
"""The helper yields the CPU to the training on a busy machine; its work can wait."""
CLOSE_TIMEOUT_S = 5.0


class HelperError(RuntimeError):
    """The helper could not summarise a window (it failed to start, died, or the trace was unreadable)."""


class SummaryHelper:
    """One helper process, started on first use; `summarize` is called from one thread at a time."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def summarize(self, trace: Path) -> WindowSummary:
        """The summary of the trace file `trace` (Chrome JSON, gzipped or not), made in the helper."""
        with self._lock:
            process = self._started()
            assert process.stdin is not None and process.stdout is not None
            try:
                pickle.dump(str(trace), process.stdin)
                process.stdin.flush()
                status, value = pickle.load(process.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as error:
                self._stop()
                raise HelperError(f"the window summary's helper process stopped ({type(error).__name__})") from error
        if status != "ok":
            raise HelperError(value)
        if not isinstance(value, WindowSummary):
            raise HelperError(f"the helper sent {type(value).__name__}, not a window summary")
        return value

    def start(self) -> None:
        """Start the helper now, so that the first window's summary does not wait for its start-up."""
        with self._lock:
            self._started()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # its errors come back as replies; nothing of it in the user's output
                env={**os.environ, "PYTHONPATH": path},
            )
        except OSError as error:
            raise HelperError(f"could not start the window summary's helper process: {error}") from error
        return self._process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()  # the helper exits at the end of its input
        try:
            process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The helper's loop: a trace path in, ("ok", summary) or ("error", message) out, until the input ends."""
    while True:
        try:
            trace = pickle.load(requests)
        except EOFError:
            return
        reply: tuple[str, Any]
        try:
            reply = ("ok", summarize(read_window_events(Path(trace))))
        except Exception as error:  # said to the caller, which warns once
            reply = ("error", f"{type(error).__name__}: {error}")
        pickle.dump(reply, replies)
        replies.flush()


def main() -> int:
    with contextlib.suppress(OSError, AttributeError):
        os.nice(NICENESS)
    replies = sys.stdout.buffer
    sys.stdout = sys.stderr  # the replies' pipe carries replies only
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):  # the training process went away
        serve(sys.stdin.buffer, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
