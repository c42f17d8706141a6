"""On a CUDA device: the in-process window summary (torch's own events) beside the trace torch exports of it.

    python benchmarks/gpu_window_summary_check.py OUT_DIR

Profiles 3 steps of a small bf16 MLP with a side stream copying pinned memory and a host pause per step (so
the device idles for the host), then writes to OUT_DIR: `rank0.pt.trace.json.gz` (torch's export of the same
window), `in_process.json` (the summary from `window_events_from_kineto`, no file read) and `categories.json`
(kineto's activity types and how many events of each). `anemoi-profiler summarize OUT_DIR --json` and HTA on
the trace then tell whether the in-process figures are the trace's (docs/hta.md).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from anemoi_profiler.profiling.kineto_events import reads_in_process, window_events_from_kineto
from anemoi_profiler.profiling.trace_stream import read_window_events
from anemoi_profiler.profiling.window_summary import summarize
from anemoi_profiler.profiling.window_table import WindowTable


def describe_events(events: list) -> dict:
    """Kineto's activity types and how many events of each; where this torch has no `activity_type()`, what
    else tells the kinds apart (device type, user annotation, correlation ids, name prefix)."""
    if events and hasattr(events[0], "activity_type"):
        return {"activity_type": Counter(event.activity_type() for event in events)}
    kinds = Counter(
        f"{event.device_type()} annotation={event.is_user_annotation()} corr={event.correlation_id() > 0} "
        f"linked={event.linked_correlation_id() > 0} {event.name()[:12]}"
        for event in events
    )
    methods = [name for name in dir(events[0]) if not name.startswith("_")] if events else []
    return {"no_activity_type": dict(kinds.most_common(60)), "methods": methods}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda().bfloat16()
    x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    pinned = torch.randn(4096, 4096).pin_memory()
    side = torch.cuda.Stream()

    def on_trace_ready(prof: profile) -> None:
        results = prof.profiler.kineto_results
        (out / "categories.json").write_text(json.dumps(describe_events(results.events()), indent=1))
        exported = out / "rank0.pt.trace.json"
        if reads_in_process():
            started = time.perf_counter()
            summary = summarize(window_events_from_kineto(results))
            seconds = time.perf_counter() - started
            prof.export_chrome_trace(str(exported))  # kineto saves a window once: after the in-process read
        else:  # torch < 2.12: the profiler reads the trace kineto saves, as here
            prof.export_chrome_trace(str(exported))
            started = time.perf_counter()
            summary = summarize(read_window_events(exported))
            seconds = time.perf_counter() - started
        table = WindowTable.of({0: summary}).to_json()
        table["seconds"] = seconds
        table["events"] = len(results.events())  # seconds / events: the reader's cost an event on a real GPU mix
        table["read"] = "in process" if reads_in_process() else "from the saved trace (torch < 2.12)"
        (out / "in_process.json").write_text(json.dumps(table, indent=1))
        with exported.open("rb") as plain, gzip.open(out / "rank0.pt.trace.json.gz", "wb") as packed:
            shutil.copyfileobj(plain, packed)
        exported.unlink()

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=3),
        on_trace_ready=on_trace_ready,
    ) as prof:
        for _ in range(5):
            model(x).float().sum().backward()
            with torch.cuda.stream(side):
                copied = pinned.to("cuda", non_blocking=True)
                copied.mul_(2)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            time.sleep(0.003)  # the host is late: the device idles ("host wait")
            prof.step()
    print(json.dumps(json.loads((out / "categories.json").read_text())))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
