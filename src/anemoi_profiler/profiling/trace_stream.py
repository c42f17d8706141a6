"""Read a saved Chrome trace event by event into compact columns, never the whole file in memory.

The `traceEvents` array is decoded one event at a time from a sliding buffer (`json.JSONDecoder.raw_decode`),
and each event goes straight into a `WindowEventsBuilder`: memory stays at the columns (about 30 bytes an
event) plus one buffer, where `json.load` and HTA hold every event as Python objects or a DataFrame.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from anemoi_profiler.profiling.window_events import WindowEvents, WindowEventsBuilder

_CHUNK_CHARS = 1 << 20
_EVENTS_KEY = '"traceEvents"'
_SKIP = " \t\r\n,"
_GZIP_MAGIC = b"\x1f\x8b"


class TraceReadError(ValueError):
    """A file that is not a Chrome trace, or one cut short."""


def open_trace(path: Path) -> IO[str]:
    """A trace file as text, gzipped or not, whatever its name (a held trace of `profiler.traces: flagged` ends in
    `.gz.held`)."""
    with open(path, "rb") as file:
        gzipped = file.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rt") if gzipped else open(path)


def iter_trace_events(file: IO[str], source: str = "trace") -> Iterator[dict]:
    """Each object of the `traceEvents` array of an open Chrome trace, decoded one at a time."""
    decoder = json.JSONDecoder()
    buffer = file.read(_CHUNK_CHARS)
    found = buffer.find(_EVENTS_KEY)
    while found < 0:
        more = file.read(_CHUNK_CHARS)
        if not more:
            raise TraceReadError(f"{source}: no traceEvents array (not a Chrome trace)")
        buffer = buffer[-len(_EVENTS_KEY) :] + more
        found = buffer.find(_EVENTS_KEY)
    position = buffer.find("[", found)
    while position < 0:  # the key at a chunk's end, its '[' in the next
        more = file.read(_CHUNK_CHARS)
        if not more:
            raise TraceReadError(f"{source}: traceEvents is not an array")
        buffer, found = buffer[found:] + more, 0
        position = buffer.find("[")
    position += 1
    while True:
        while position < len(buffer) and buffer[position] in _SKIP:
            position += 1
        if position < len(buffer) and buffer[position] == "]":
            return
        try:
            event, end = decoder.raw_decode(buffer, position)
        except json.JSONDecodeError:
            more = file.read(_CHUNK_CHARS)
            if not more:
                raise TraceReadError(f"{source}: cut short inside traceEvents") from None
            buffer, position = buffer[position:] + more, 0
            continue
        if isinstance(event, dict):
            yield event
        position = end


def read_window_events(path: Path) -> WindowEvents:
    """The events of one trace file as columns (see `WindowEventsBuilder.add_chrome_event`)."""
    builder = WindowEventsBuilder()
    try:
        with open_trace(path) as file:
            for event in iter_trace_events(file, str(path)):
                builder.add_chrome_event(event)
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise TraceReadError(f"{path}: unreadable ({type(error).__name__}: {error})") from error
    return builder.build()
