"""One `torch.profiler.profile` over one stage run, started at the schedule's first batch and stepped per batch.

It counts the steps each window really recorded (a run can end in the middle of a window) and stops a
failing profiler at once, so that it never keeps recording a training that no longer steps it.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerAction, ProfilerActivity

from anemoi_profiler.config_sections import TorchProfilerConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.profiling.schedule import WindowSchedule
from anemoi_profiler.profiling.torch_private import cuda_sync_events_config
from anemoi_profiler.profiling.traces import RANK_INFO_KEY

log = get_logger(__name__)

WindowHandler = Callable[[Any, str, int], None]
"""Called with (profile, stage, recorded steps) when a window is complete."""
_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
# torch says this when a second cycle starts; dropping the first cycle's events is what we want.
_CYCLE_WARNING = ".*Profiler clears events at the end of each cycle.*"


def uses_cuda(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def effective_options(options: TorchProfilerConfig, device: torch.device) -> TorchProfilerConfig:
    """The options as recorded: the memory timeline needs stacks, shapes and memory, so it turns them on."""
    needed = ("with_stack", "record_shapes", "profile_memory")
    if not (options.memory_timeline and uses_cuda(device)) or all(getattr(options, n) for n in needed):
        return options
    log.info("profiler.memory_timeline turns on profiler.%s", ", profiler.".join(needed))
    return dataclasses.replace(options, with_stack=True, record_shapes=True, profile_memory=True)


def profiler_arguments(options: TorchProfilerConfig, device: torch.device) -> dict[str, Any]:
    """Keyword arguments of `torch.profiler.profile`: CPU, plus CUDA when the model is on a GPU."""
    cuda = uses_cuda(device)
    arguments: dict[str, Any] = {
        "activities": [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU],
        "record_shapes": options.record_shapes,
        "profile_memory": options.profile_memory,
        "with_stack": options.with_stack,
        "with_flops": options.with_flops,
        "with_modules": options.with_modules,
    }
    if cuda and options.sync_events:
        # CUDA synchronization events: HTA's critical-path analysis needs them.
        arguments["experimental_config"] = cuda_sync_events_config()
    return arguments


class WindowRecorder:
    """Drives one profile; `on_window` receives each finished window."""

    def __init__(
        self,
        stage: str,
        schedule: WindowSchedule,
        options: TorchProfilerConfig,
        device: torch.device,
        rank_info: dict[str, Any],
        on_window: WindowHandler,
    ) -> None:
        self.stage = stage
        self._schedule = schedule.torch_schedule()
        self._on_window = on_window
        self._recorded = 0
        self._running = False
        self._profile = torch.profiler.profile(
            **profiler_arguments(options, device), schedule=self._schedule, on_trace_ready=self._trace_ready
        )
        if not (dist.is_available() and dist.is_initialized()):
            # torch writes distributedInfo itself only under torch.distributed; HTA needs it in every trace.
            self._profile.preset_metadata_json(RANK_INFO_KEY, json.dumps(rank_info))

    @property
    def recording(self) -> bool:
        """The current batch is recorded (an active step of a window)."""
        return self._running and self._profile.current_action in _RECORDING

    @property
    def busy(self) -> bool:
        """The profiler is warming up or recording: no other profiler may start now."""
        return self._running and self._profile.current_action != ProfilerAction.NONE

    def start(self, batch: int) -> None:
        """Start at `batch`, so that the schedule and `ProfilerStep#<n>` count batches of the stage."""
        self._profile.step_num = batch
        self._profile.current_action = self._schedule(batch)
        self._running = True
        self._guard(self._profile.__enter__)

    def step(self) -> None:
        """The current batch has ended."""
        if self.recording:
            self._recorded += 1
        self._guard(self._profile.step)

    def stop(self) -> None:
        """Stop recording; a window in progress is handed over with the steps it has."""
        if self._running:
            self._running = False
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_CYCLE_WARNING)
                self._profile.__exit__(None, None, None)

    def _guard(self, action: Callable[[], Any]) -> None:
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_CYCLE_WARNING)
                action()
        except Exception:
            self._abort()
            raise

    def _abort(self) -> None:
        self._running = False
        try:
            self._profile.__exit__(None, None, None)
        except Exception as error:
            log.debug("stopping a failed profiler: %s", error)

    def _trace_ready(self, prof: Any) -> None:
        steps, self._recorded = self._recorded, 0
        try:
            self._on_window(prof, self.stage, steps)
        except Exception as error:  # a failed export must not stop the profiler's own bookkeeping
            log.warning(
                "could not save the %s profiling window: %s: %s",
                self.stage,
                type(error).__name__,
                error,
            )
