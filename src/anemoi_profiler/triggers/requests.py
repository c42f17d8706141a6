"""Profiling windows on request, without a daemon: a request file in the run folder, polled off the training thread.

`anemoi-profiler request <run folder>` writes `window_request.json`; rank 0's `RequestPoller` thread reads it at
most every `poll_s` seconds and hands a new request to the training thread, which passes it to every rank with
the next interval exchange. The job writes back the window and the step it was served at. Torch-free: the
command line writes the same file.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.layout import REQUEST_FILE

log = get_logger(__name__)

REQUEST_TAG = "profiler.request"
"""The MLflow run tag through which `anemoi-profiler request <run id>` asks (the request as JSON)."""
SERVED_TAG = "profiler.request_served"
"""The tag through which the job answers: the request's id, the window and the batch it was served at."""


@dataclass
class WindowRequest:
    """A request and, once served, its answer. `ranks` empty: the configured `distributed.profiled_ranks`."""

    id: str
    steps: int
    ranks: list[int]
    requested_at: float
    memory: bool = False
    """Also a CUDA memory snapshot of the window on its ranks (`request --memory`)."""
    served_window: int | None = None
    served_at_step: int | None = None


def new_request(steps: int, ranks: list[int], memory: bool = False) -> WindowRequest:
    """A request for a window of `steps` batches on `ranks` (with a memory snapshot); ValueError naming the bad
    option."""
    if steps < 1:
        raise ValueError(f"--steps: got {steps}, expected an integer >= 1")
    if any(rank < 0 for rank in ranks):
        raise ValueError(f"--ranks: got {ranks}, expected global ranks (integers >= 0)")
    return WindowRequest(uuid.uuid4().hex[:12], steps, sorted(set(ranks)), time.time(), memory)


def write_request(run_dir: Path, request: WindowRequest) -> None:
    """Ask the job writing `run_dir` for a window; replaces an earlier request that was not served yet."""
    _write(run_dir, request)


def relay_tag(run_dir: Path, tag: str) -> None:
    """The request of a `profiler.request` tag into the run folder, unless it is there already (the sender
    process of rank 0 relays it, so that a request from a laptop that reaches only MLflow takes the file's way)."""
    try:
        request = WindowRequest(**json.loads(tag))
    except (ValueError, TypeError) as error:
        log.warning("ignoring the run's %s tag: %s", REQUEST_TAG, error)
        return
    current = read_request(run_dir)
    if current is None or current.id != request.id:
        _write(run_dir, request)


def served_tag(request: WindowRequest) -> str:
    return json.dumps({"id": request.id, "window": request.served_window, "batch": request.served_at_step})


def read_request(run_dir: Path) -> WindowRequest | None:
    """The request file's request; None without one (or one that cannot be read: said in a debug line)."""
    try:
        return WindowRequest(**json.loads((run_dir / REQUEST_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as error:
        log.debug("unreadable %s: %s", REQUEST_FILE, error)
        return None


def mark_served(run_dir: Path, request: WindowRequest, window: int, batch: int) -> None:
    request.served_window, request.served_at_step = window, batch
    _write(run_dir, request)


def _write(run_dir: Path, request: WindowRequest) -> None:
    partial = run_dir / f".{REQUEST_FILE}.part"
    partial.write_text(json.dumps(asdict(request), indent=2) + "\n")
    os.replace(partial, run_dir / REQUEST_FILE)  # a reader never sees half a request


class RequestPoller:
    """A daemon thread that looks for a new, unserved request every `poll_s` seconds; `take()` hands it over."""

    def __init__(self, run_dir: Path, poll_s: float) -> None:
        self._run_dir = run_dir
        self._poll_s = poll_s
        self._seen: set[str] = set()
        self._new: WindowRequest | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="anemoi-profiler-requests", daemon=True)
        self._thread.start()

    def take(self) -> WindowRequest | None:
        """The newest request not handed over yet (called on the training thread: no I/O)."""
        request, self._new = self._new, None
        return request

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._poll_s + 1)

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            request = read_request(self._run_dir)
            if request is not None and request.served_at_step is None and request.id not in self._seen:
                self._seen.add(request.id)
                self._new = request
