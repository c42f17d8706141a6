"""Triggered profiling windows during a fit: the detectors fed at each exchange, the plans every rank follows.

At each training log interval every rank gets every rank's `RankTotals` (and rank 0's request, an
`ExchangeControl`) from the clock's exchange and feeds the same figures to the same detectors
(`triggers.detector`), so every rank decides the same window at the same batch without a collective of its own.
The torch profiler callback opens a pending plan at its next training batch; the ranks a plan names record, the
others only count the window, so `window_<k>` means the same window on every rank. Rank 0 lists every window,
with its reason and evidence, in `windows.json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from anemoi_profiler.clock import ExchangeControl, RankTotals
from anemoi_profiler.clock.rank_figures import collective_waits_ms
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.logs import get_logger
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.reports.description import WINDOWS_SECTION
from anemoi_profiler.run_files.layout import TRACE_SUFFIX, TRACES_DIR, WINDOWS_FILE, window_snapshot_path
from anemoi_profiler.triggers.detector import (
    DriftDetector,
    Evidence,
    IntervalFigures,
    MemoryClimbDetector,
    SlowRankDetector,
    Triggers,
)
from anemoi_profiler.triggers.requests import RequestPoller, WindowRequest, mark_served

log = get_logger(__name__)

TRIGGERS_TAG = "profiler.triggers"
"""The run's tag that shows the triggers armed, the windows left in the budget and the last trigger."""


@dataclass
class WindowPlan:
    """A window every rank agreed on: why, which ranks record, how long; `window` and `start_batch` once open."""

    reason: str
    ranks: list[int]
    steps: int
    warmup: int
    decided_at_step: int
    evidence: Evidence | None
    window: int | None = None
    start_batch: int | None = None
    start_step: int | None = None
    """The global step as its first recorded batch starts: the step-time plot's axis, which counts optimizer
    steps (fewer than batches with `accumulate_grad_batches` > 1)."""
    request: WindowRequest | None = None
    """The request it serves (on rank 0, which answers it)."""
    memory: bool = False
    """Its ranks also take a CUDA memory snapshot (`request --memory`, the memory trigger)."""


class TriggerWatch:
    """The detectors of a run under their budget, requests, and the plans they made (identical on every rank).

    An error turns it off on this rank with one warning; training goes on.
    """

    def __init__(
        self,
        triggers: Triggers,
        config: ProfilerConfig,
        world_size: int,
        exchange: RankExchange,
        poller: RequestPoller | None,
        run_dir: Path,
        profiled_ranks: list[int],
    ) -> None:
        """`profiled_ranks`: the ranks a window records when its trigger or request names none."""
        self.triggers = triggers
        self.steps = config.triggers.steps
        self.warmup = config.triggers.profiler_warmup
        self.world_size = world_size
        self.profiled_ranks = profiled_ranks
        self._exchange = exchange
        self.pending: WindowPlan | None = None
        self.plans: list[WindowPlan] = []
        self._poller = poller
        self._run_dir = run_dir
        self._outgoing: WindowRequest | None = None  # rank 0: a request sent until a plan takes it
        self._broken = False

    @classmethod
    def of_config(
        cls,
        config: ProfilerConfig,
        world_size: int,
        rank: int,
        run_dir: Path,
        exchange: RankExchange,
        profiled_ranks: list[int],
    ) -> TriggerWatch:
        options = config.triggers
        detectors = (options.warmup_intervals, options.baseline_intervals)
        drift = (
            DriftDetector(*detectors, options.min_slowdown, options.sigmas, options.confirm_intervals)
            if options.drift
            else None
        )
        slow_rank = (
            SlowRankDetector(*detectors, options.min_lag, options.sigmas, options.confirm_intervals)
            if options.slow_rank and world_size > 1
            else None
        )
        memory = (
            MemoryClimbDetector(options.warmup_intervals, options.memory_intervals, options.min_memory_growth)
            if options.memory
            else None
        )
        triggers = Triggers(drift, slow_rank, memory, options.cooldown_steps, options.max_windows)
        poller = RequestPoller(run_dir, options.request_poll_s) if options.requests and rank == 0 else None
        return cls(triggers, config, world_size, exchange, poller, run_dir, profiled_ranks)

    def outgoing(self, control: ExchangeControl) -> None:
        """Rank 0 puts a new request into the training exchange (again, until a window takes it)."""
        if self._poller is not None and not self._broken:
            self._outgoing = self._poller.take() or self._outgoing
            if self._outgoing is not None:
                control.requested_steps = float(self._outgoing.steps)
                control.requested_ranks = float(len(self._outgoing.ranks))
                control.requested_memory = float(self._outgoing.memory)

    def received(self, step: int, ranks: list[RankTotals], controls: list[ExchangeControl]) -> None:
        sent = controls[0] if controls else ExchangeControl()
        named = self._named_ranks(sent)  # a collective: before anything that could differ between ranks
        if self._broken:
            return
        try:
            self._decide(step, ranks, sent, named)
        except Exception as error:
            self._broken = True
            log.warning("triggers are off after an error: %s: %s", type(error).__name__, error)

    def _named_ranks(self, sent: ExchangeControl) -> list[int]:
        """The ranks named by a request in this exchange, broadcast by rank 0 (any rank of any job: the exchange
        carries only how many). A collective, decided from the gathered figures alone, so every rank joins it;
        only in an exchange that carries such a request. Ranks the job does not have are left out."""
        if sent.requested_steps <= 0 or sent.requested_ranks <= 0:
            return []
        mine = json.dumps(self._outgoing.ranks) if self._outgoing is not None else "[]"
        text = self._exchange.broadcast_text(mine)
        named = [int(rank) for rank in json.loads(text)] if text is not None else []
        known = [rank for rank in named if rank < self.world_size]
        if self._poller is not None and len(known) < len(named):
            log.warning(
                "the request names ranks %s, the job has ranks 0 to %d: %s",
                named, self.world_size - 1, "the others are left out" if known else "the profiled ranks record",
            )  # fmt: skip
        return known

    def _decide(self, step: int, ranks: list[RankTotals], sent: ExchangeControl, named: list[int]) -> None:
        """Feed one training interval's figures of every rank; a request or a trigger becomes the pending plan."""
        measured = [rank.step_ms for rank in ranks if rank.step_ms > 0]
        if measured:  # the detectors keep learning while a plan waits
            peaks = [rank.peak_allocated_mb or rank.cpu_rss_mb for rank in ranks]
            fired = self.triggers.observe(
                IntervalFigures(step, mean(measured), collective_waits_ms(ranks) or None, peaks)
            )
        else:
            fired = None
        if self.pending is not None:
            return
        requested = sent.requested_steps
        if requested > 0:
            recording = named or self.profiled_ranks
            request, self._outgoing = self._outgoing, None
            memory = sent.requested_memory > 0
            plan = WindowPlan("request", recording, int(requested), self.warmup, step, None)
            self._plan(plan, request=request, memory=memory)
        elif fired is not None:
            recording = list(fired.ranks) or self.profiled_ranks
            plan = WindowPlan(fired.reason, recording, self.steps, self.warmup, step, fired.evidence)
            self._plan(plan, memory=fired.reason == "memory")  # a snapshot says what holds the memory that climbs

    def _plan(self, plan: WindowPlan, request: WindowRequest | None = None, memory: bool = False) -> None:
        plan.request, plan.memory = request, memory
        self.pending = plan
        log.info(
            "%s at step %d%s: a %d-step window on rank%s %s",
            plan.reason,
            plan.decided_at_step,
            f" ({plan.evidence.describe()})" if plan.evidence else "",
            plan.steps,
            "" if len(plan.ranks) == 1 else "s",
            ", ".join(map(str, plan.ranks)),
        )

    def open_pending(self, window: int, start_batch: int) -> WindowPlan | None:
        """The pending plan, numbered `window`, recording from `start_batch` on; a request is answered."""
        plan, self.pending = self.pending, None
        if plan is not None:
            plan.window, plan.start_batch = window, start_batch
            self.plans.append(plan)
            if plan.request is not None:
                mark_served(self._run_dir, plan.request, window, start_batch)
        return plan

    def status(self) -> str:
        """What the run page shows: the triggers armed, the windows left, the last trigger."""
        armed = ", ".join(self.triggers.armed + (["requests"] if self._poller else [])) or "none"
        last = self.triggers.last
        said = f"; last: {last[1].reason} at step {last[0]}" if last else ""
        return f"armed: {armed}; triggered windows left: {self.triggers.windows_left}{said}"

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()


def window_entries(
    run_dir: Path,
    plans: list[WindowPlan],
    active: dict[str, int],
    device_type: str,
    end_held_s: Mapping[tuple[str, int], float] | None = None,
) -> list[dict[str, Any]]:
    """Every window of the run: the triggered ones from their plans, the scheduled ones from the trace folders
    (the ranks whose trace files are there; none when traces are off). `end_held_s`: how long each window's end
    held this rank's training thread (`end_held_ms`, None where this rank did not record it)."""
    held = end_held_s or {}

    def held_ms(stage: str, window: int | None) -> float | None:
        seconds = held.get((stage, window)) if window is not None else None
        return None if seconds is None else round(seconds * 1000, 3)

    triggered = {("train", plan.window): plan for plan in plans}
    entries = [
        {"window": plan.window, "stage": "train", "start_batch": plan.start_batch, "start_step": plan.start_step,
         "steps": plan.steps,
         "ranks": plan.ranks, "reason": plan.reason, "decided_at_step": plan.decided_at_step,
         "evidence": asdict(plan.evidence) if plan.evidence else None,
         "request": plan.request.id if plan.request else None,
         "memory_snapshot": memory_snapshot_note(run_dir, plan, device_type) if plan.memory else None,
         "end_held_ms": held_ms("train", plan.window)}
        for plan in plans
    ]  # fmt: skip
    for folder in sorted((run_dir / TRACES_DIR).glob("*/window_*")):
        stage, window = folder.parent.name, int(folder.name.removeprefix("window_"))
        if (stage, window) in triggered or not folder.is_dir():
            continue
        traces = folder.glob(f"rank*{TRACE_SUFFIX}")  # not the held ones of `profiler.traces: flagged`
        ranks = sorted(int(path.name.removeprefix("rank").removesuffix(TRACE_SUFFIX)) for path in traces)
        entries.append(
            {"window": window, "stage": stage, "start_batch": None, "start_step": None, "steps": active.get(stage),
             "ranks": ranks,
             "reason": "schedule", "decided_at_step": None, "evidence": None,
             "end_held_ms": held_ms(stage, window)}
        )  # fmt: skip
    return sorted(entries, key=lambda entry: (entry["stage"], entry["window"]))


def memory_snapshot_note(run_dir: Path, plan: WindowPlan, device_type: str) -> str:
    """What came of a window's memory snapshot: the files written, or why there are none."""
    if device_type != "cuda":
        return f"not assessed: a CUDA memory snapshot needs a CUDA device, this run is on {device_type}"
    assert plan.window is not None
    paths = [window_snapshot_path(run_dir, rank, plan.window) for rank in plan.ranks]
    written = [str(path.relative_to(run_dir)) for path in paths if path.is_file()]
    return ", ".join(written) or "none written yet (the window has not ended, or the dump failed: see the log)"


def write_windows(run_dir: Path, entries: list[dict[str, Any]]) -> Path:
    path = run_dir / WINDOWS_FILE
    path.write_text(json.dumps({"windows": entries}, indent=2) + "\n")
    return path


WINDOW_COLUMNS = ("stage", "window", "start batch", "steps", "ranks", "reason", "evidence", "end held (ms)",
                  "memory snapshot")  # fmt: skip


def windows_section(entries: list[dict[str, Any]]) -> ReportSection | None:
    """The report's list of windows; the triggered ones say why."""
    if not entries:
        return None
    rows = [
        [entry["stage"], entry["window"], entry["start_batch"] if entry["start_batch"] is not None else "",
         entry["steps"], ",".join(map(str, entry["ranks"])), entry["reason"],
         Evidence(**entry["evidence"]).describe() if entry["evidence"] else "",
         "" if entry.get("end_held_ms") is None else f"{entry['end_held_ms']:.1f}", entry.get("memory_snapshot") or ""]
        for entry in entries
    ]  # fmt: skip
    triggered = sum(entry["reason"] != "schedule" for entry in entries)
    return ReportSection(
        WINDOWS_SECTION,
        list(WINDOW_COLUMNS),
        rows,
        data={"windows": entries},
        note=f"{triggered} triggered; traces in {TRACES_DIR}/<stage>/window_<k>/, listed in {WINDOWS_FILE}; end held: "
        "how long the window's end (torch's stop, the trace export, handing it over) held rank 0's training thread",
    )
