"""The stall watchdog: one thread per rank that notices when no batch has finished for `postmortem.stall_after_s`.

It reads a counter that the stage clock's batch hooks already update, once a second: nothing runs per step on
the training thread. On a stall it writes this rank's part (`postmortem/stall_<k>/rank<r>.json`: where the
training thread is, every thread's stack, the last finished step) and merges every part found into
`postmortem/stall_<k>.json`. The ranks cannot use collectives while one of them is stuck, so they meet in the
run folder, which every rank writes to already (traces, window summaries): each rank merges what it finds, on
each wake while the stall lasts, so the last part in completes the file. When batches finish again, each rank
adds how long the stall lasted. It never stops or aborts the job.

A step wedged in C code that keeps the interpreter lock stops this thread too: `native_stacks` keeps
faulthandler's C timer armed a little past the threshold, re-armed here on each wake that sees progress; its dump
is recorded by the MLflow sender while the job is wedged, and taken here as the episode's part once this thread
runs again (one episode, not two).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from anemoi_profiler.logs import get_logger
from anemoi_profiler.postmortem.native_stacks import MARGIN_S, NativeStacks
from anemoi_profiler.postmortem.stacks import BACKWARD, describe, phase_of, thread_stacks, user_frame
from anemoi_profiler.run_files.layout import stall_part_path, stall_path
from anemoi_profiler.run_files.postmortem_files import GRADIENT_ALL_REDUCE, merge_stall, read_parts, write_record

log = get_logger(__name__)

AUTO_MIN_S = 300.0
"""`stall_after_s: auto`: never less than five minutes (a checkpoint, a validation pass, an epoch's start)..."""
AUTO_STEPS = 100
"""... and never less than this many median steps."""
WAKE_S = 1.0


class Progress:
    """What the watchdog reads from the training: all plain attribute reads, made by the training's own hooks."""

    def __init__(
        self,
        finished: Callable[[], int],
        step: Callable[[], int],
        recent_steps_s: Callable[[], list[float]],
        all_reduce_pending: Callable[[], bool],
    ) -> None:
        self.finished = finished
        """Training and validation batches finished so far."""
        self.step = step
        self.recent_steps_s = recent_steps_s
        self.all_reduce_pending = all_reduce_pending
        """DDP's last gradient bucket was launched and its all-reduce has not completed."""


class StallWatchdog:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world_size: int,
        stall_after_s: float | str,
        progress: Progress,
        on_stall: Callable[[dict[str, Any]], None] = lambda merged: None,
        dump_flight_recorder: Callable[[Path], dict[str, Any] | None] = lambda path: None,
        native_stacks: bool = True,
    ) -> None:
        """`native_stacks`: arm faulthandler's C timer too, for a wedge that stops this thread."""
        self.run_dir, self.rank, self.world_size = run_dir, rank, world_size
        self.stall_after_s = stall_after_s
        self.progress = progress
        self.on_stall = on_stall
        """Called after each merge that found a new part (rank 0 tells MLflow), off the training thread."""
        self.dump_flight_recorder = dump_flight_recorder
        """Writes this rank's Flight Recorder beside its part; returns each process group's last collective."""
        self.training_thread = threading.get_ident()  # made on the training thread, when training starts
        self.episodes = 0
        self._part: dict[str, Any] | None = None
        """This rank's part of the stall going on."""
        self._merged_parts = 0
        self._seen, self._since = 0, time.monotonic()
        self._native_wanted = native_stacks
        self._native: NativeStacks | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="anemoi-profiler-watchdog", daemon=True)

    def start(self) -> None:
        if self._native_wanted:
            native = NativeStacks(self.run_dir, self.rank, self.world_size, self.training_thread)
            self._native = native if native.open() else None
        self._seen, self._since = self.progress.finished(), time.monotonic()
        self._arm()  # armed before training goes on: a wedge at the first step is seen too
        self._thread.start()

    def stop(self) -> None:
        """At the end of training: a stall (or a wedge) that ended since the last wake gets its length; the C
        timer is cancelled."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        try:
            if self._thread.is_alive():
                return  # stuck in a record: its part stays as it is; the timer is cancelled all the same
            if self._part is not None or (self._native is not None and self._native.written()):
                self._tick()
        finally:
            if self._native is not None:
                self._native.close()  # inert from now on, also for a watchdog thread still running

    def threshold_s(self) -> float:
        if self.stall_after_s != "auto":
            return float(self.stall_after_s)
        recent = self.progress.recent_steps_s()
        return max(AUTO_MIN_S, AUTO_STEPS * median(recent)) if recent else AUTO_MIN_S

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as error:  # the watchdog is gone, the training goes on
            log.warning("the stall watchdog stopped: %s: %s", type(error).__name__, error)

    def _watch(self) -> None:
        while not self._stop.wait(WAKE_S):
            self._tick()

    def _arm(self) -> None:
        """Push faulthandler's timer back: the run moved, a wedge from now on is the next episode."""
        if self._native is not None:
            self._native.arm(self.episodes + 1, self.threshold_s() + MARGIN_S, self.progress.step(), self._seen)

    def _tick(self) -> None:
        finished, now = self.progress.finished(), time.monotonic()
        if self._part is None and self._native is not None and (wedged := self._native.wedge()) is not None:
            # This thread could not run (the interpreter lock held): the C timer's dump is the episode's part.
            self.episodes = wedged["episode"]
            self._part = wedged
            self._write_part(wedged)
            self._merged_parts = 0
            log.warning(
                "rank %d: no Python thread could run for %.0f s, after step %d; the training thread was in %s at %s",
                self.rank,
                wedged["stalled_for_s"],
                wedged["last_step"],
                wedged["phase"],
                wedged["frame"],
            )
        part = self._part
        if finished != self._seen:
            if part is not None:  # the run moved on: how long it stood still stays in the record
                part["resumed_after_s"] = now - self._since
                self._write_part(part)
                self._merge(part["episode"])
                self._part = None
            self._seen, self._since = finished, now
            self._arm()
            return
        if part is None and now - self._since >= self.threshold_s():
            if self._native is not None:
                self._native.disarm()  # this thread records it: the C timer would be a second record
            self.episodes += 1
            part = self._part = self._record(self.episodes, now - self._since)
            self._write_part(part)
            self._merged_parts = 0
        if part is not None:
            found = len(list(stall_part_path(self.run_dir, part["episode"], 0).parent.glob("rank*.json")))
            if found != self._merged_parts:  # a new part in: merge again (the last rank in completes the file)
                self._merged_parts = found
                self.on_stall(self._merge(part["episode"]))

    def _record(self, episode: int, stalled_for_s: float) -> dict[str, Any]:
        threads = thread_stacks()
        training = next((t for t in threads if t["ident"] == self.training_thread), None)
        frames = training["stack"] if training is not None else []
        phase = phase_of(frames)
        if phase == BACKWARD and self.progress.all_reduce_pending():
            phase = f"{BACKWARD}: {GRADIENT_ALL_REDUCE}"
        part = {
            "rank": self.rank,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "episode": episode,
            "detected_at": time.time(),
            "threshold_s": self.threshold_s(),
            "stalled_for_s": stalled_for_s,
            "last_step": self.progress.step(),
            "batches_finished": self.progress.finished(),
            "phase": phase,
            "frame": describe(user_frame(frames)),
            "innermost": describe(frames[-1] if frames else None),
            "training_thread": training["name"] if training is not None else None,
            "resumed_after_s": None,
            "threads": threads,
        }
        part["last_collectives"] = self.dump_flight_recorder(stall_part_path(self.run_dir, episode, self.rank).parent)
        log.warning(
            "rank %d: no batch finished for %.0f s, after step %d; the training thread is in %s at %s (%s)",
            self.rank,
            stalled_for_s,
            part["last_step"],
            phase,
            part["frame"],
            stall_part_path(self.run_dir, episode, self.rank),
        )
        return part

    def _write_part(self, part: dict[str, Any]) -> None:
        write_json(stall_part_path(self.run_dir, part["episode"], self.rank), part)

    def _merge(self, episode: int) -> dict[str, Any]:
        return merge_episode(self.run_dir, episode, self.world_size)


def merge_episode(run_dir: Path, episode: int, world_size: int) -> dict[str, Any]:
    """`stall_<k>.json` from the parts the ranks have written so far."""
    merged = merge_stall(read_parts(run_dir, episode), world_size)
    write_json(stall_path(run_dir, episode), merged)
    return merged


def write_json(path: Path, value: Any) -> None:
    """Whole or not at all: another rank may read it at any moment."""
    write_record(path, value)
