"""Where a thread is: every thread's Python stack, and the training thread's phase read from its frames.

Torch-free and cheap enough for a stall or a signal, never used per step. How a stack reads as a phase and a
user's frame is `run_files.stack_frames` (shared with the MLflow sender, which reads faulthandler's dumps);
its names are re-exported here.
"""

from __future__ import annotations

import sys
import threading
import traceback
from types import FrameType
from typing import Any

from anemoi_profiler.run_files.stack_frames import (
    BACKWARD,
    COLLECTIVES,
    DATA_FETCH,
    FORWARD,
    VALIDATION,
    Frame,
    describe,
    phase_of,
    user_frame,
)

__all__ = [
    "BACKWARD",
    "COLLECTIVES",
    "DATA_FETCH",
    "FORWARD",
    "VALIDATION",
    "Frame",
    "describe",
    "frames_of",
    "frames_of_traceback",
    "phase_of",
    "thread_stacks",
    "user_frame",
]


def frames_of(frame: FrameType | None) -> list[Frame]:
    """A stack, outermost first."""
    return [_frame(entry) for entry in traceback.extract_stack(frame)] if frame is not None else []


def frames_of_traceback(error: BaseException) -> list[Frame]:
    """Where an exception went: from the outermost frame of its traceback to where it was raised."""
    return [_frame(entry) for entry in traceback.extract_tb(error.__traceback__)]


def _frame(entry: traceback.FrameSummary) -> Frame:
    return {"file": entry.filename, "line": entry.lineno, "function": entry.name, "code": entry.line or ""}


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread of this process with its name and stack (`sys._current_frames`)."""
    names = {thread.ident: thread for thread in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        stacks.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "ident": ident,
                "daemon": thread.daemon if thread is not None else None,
                "stack": frames_of(frame),
            }
        )
    return stacks
