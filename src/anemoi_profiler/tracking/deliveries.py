"""Deliveries still going on after `close(wait=False)`: a short fit's run reaches MLflow in the background.

The sinks register here when they close without waiting; `wait_for_mlflow` (public) and the next sink of the
process (one delivery at a time: two senders opening a new sqlite store at once both run MLflow's migrations,
and one fails) wait for them.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class _Closing(Protocol):
    def wait_closed(self, timeout_s: float | None) -> bool | None: ...


_closing: set[_Closing] = set()
"""Closed sinks whose delivery no one has waited for yet (`wait_closed`)."""
_lock = threading.Lock()


def add(sink: _Closing) -> None:
    with _lock:
        _closing.add(sink)


def discard(sink: _Closing) -> None:
    with _lock:
        _closing.discard(sink)


def wait_for_mlflow(timeout_s: float = 60.0) -> bool:
    """Wait until every profiled run of this process that is still being sent has reached MLflow (at most
    `timeout_s`). A fit that ends before its MLflow sender has started returns at once and leaves the delivery
    to the background: call this before reading such a run back from MLflow. False when a delivery it waited
    for is still going on at the timeout or left batches in its spool (a warning says where).

    Args:
        timeout_s: The most seconds to wait, for all runs together.

    Returns:
        True when everything waited for reached MLflow.
    """
    return wait(timeout_s)


def wait(timeout_s: float | None, but: _Closing | None = None) -> bool:
    """Wait for every registered delivery but `but`; True when all of them left nothing in their spool."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with _lock:
        sinks = [sink for sink in _closing if sink is not but]
    results = [sink.wait_closed(None if deadline is None else max(0.0, deadline - time.monotonic())) for sink in sinks]
    return all(result is True for result in results)
