"""Every private or recent torch name the profiler relies on, here alone, with the versions it holds in.

torch has no public way to read a profiling window's events without writing a trace, to ask CUDA's profiler for
synchronization events (HTA's critical path needs them), or to record and dump the caching allocator's history
(what pytorch.org/memory_viz opens). The profiler reaches them through the functions below; the supported range
is torch 2.4 to the newest. tests/unit/test_torch_private.py checks each against the installed torch, on every stack of
the version matrix (ci/matrix), so that a name that moves fails there rather than in a user's run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

KINETO_ACTIVITY_TYPE_FROM = (2, 12)
"""`torch._C._autograd._KinetoEvent.activity_type`, each event's kineto category (`kernel`, `cpu_op`, ...), exists
from torch 2.12: before it, a window is read from the Chrome trace kineto saves."""


CYCLES_SHARE_ONE_PROFILER = ((2, 4), (2, 4))
"""torch 2.4 keeps one `torch.profiler.profile(...).profiler` through a schedule's cycles and appends each cycle's
function events to it (pytorch#125510); torch 2.5 gives each cycle its own again (`acc_events=False`, #133095)."""


def torch_version() -> tuple[int, int]:
    major, minor, *_ = torch.__version__.split(".")
    return int(major), int(minor)


def kineto_events_have_activity_type() -> bool:
    """Whether this torch tells Python each event's category (`_KinetoEvent.activity_type`)."""
    from torch._C._autograd import _KinetoEvent

    return hasattr(_KinetoEvent, "activity_type")


def kineto_results(profiler: Any) -> Any:
    """A finished window's `_ProfilerResult`, from `torch.profiler.profile(...).profiler` (`.events()`: a list of
    `_KinetoEvent` with `start_ns`, `duration_ns`, `name`, `correlation_id`, `device_resource_id`; `.save(path)`:
    its Chrome trace)."""
    return profiler.kineto_results


def cycles_share_one_profiler() -> bool:
    """Whether a window's `profiler` object also holds the events of the windows before it (torch 2.4)."""
    first, last = CYCLES_SHARE_ONE_PROFILER
    return first <= torch_version() <= last


def window_key_averages(profiler: Any, events: tuple[int, int] | None = None) -> Any:
    """`key_averages()` of a finished window: of its function events `events` (first, end) where cycles share one
    profiler object (the others are other windows'), else of all of them."""
    if events is None:
        return profiler.key_averages()
    from torch.autograd.profiler_util import EventList

    window = EventList(profiler.function_events[slice(*events)])
    window._tree_built = True  # a slice of a list whose tree torch built: the events keep their parents
    return window.key_averages()


def cuda_sync_events_config() -> Any:
    """`experimental_config` for `torch.profiler.profile` that records CUDA synchronization events (torch >= 2.2)."""
    return torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)


def record_memory_history(max_entries: int, python_stacks_only: bool = False) -> None:
    """Start recording the CUDA caching allocator's history, at most `max_entries` events
    (`torch.cuda.memory._record_memory_history`, string `enabled` since torch 2.1); stack traces of Python only
    when `python_stacks_only` (cheaper), else Python and C++."""
    if python_stacks_only:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    else:
        torch.cuda.memory._record_memory_history(enabled="all", max_entries=max_entries)


def stop_memory_history() -> None:
    """Stop recording (which also clears the history, in every supported torch)."""
    torch.cuda.memory._record_memory_history(enabled=None)


def memory_snapshot() -> dict[str, Any]:
    """The allocator's state and recorded history as the dict `torch.cuda.memory._dump_snapshot` pickles."""
    return torch.cuda.memory._snapshot()


OutOfMemoryError: type[Exception] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
"""What the caching allocator raises, CUDA's and ROCm's (`torch.OutOfMemoryError` from torch 2.5, the same class
as `torch.cuda.OutOfMemoryError`, which is all older torch has)."""


def attach_out_of_memory_observer(observer: Callable[[int, int, int, int], None]) -> None:
    """Call `observer(device, requested bytes, device allocated bytes, device free bytes)` at a failed CUDA
    allocation, before the error unwinds (`torch._C._cuda_attach_out_of_memory_observer`; CUDA builds only)."""
    torch._C._cuda_attach_out_of_memory_observer(observer)  # type: ignore[attr-defined]


def flight_recorder_names() -> tuple[str, str]:
    """The environment variables of the Flight Recorder's size and of NCCL's dump file on a timeout: `TORCH_FR_*`
    where torch has the recorder for every backend (gloo too; it warns about the old names), else `TORCH_NCCL_*`."""
    if _has_recorder_for_every_backend():
        return "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"
    return "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"


def flight_recorder_dump() -> bytes | None:
    """This process's Flight Recorder now (a pickle `torchfrtrace` reads): every backend's where torch has that
    recorder, else NCCL's (`_dump_nccl_trace`) when the default group is NCCL; None where there is none."""
    c10d: Any = torch._C._distributed_c10d
    if _has_recorder_for_every_backend():
        return c10d._dump_fr_trace()
    if torch.distributed.get_backend() == "nccl" and hasattr(c10d, "_dump_nccl_trace"):
        return c10d._dump_nccl_trace()
    return None


def _has_recorder_for_every_backend() -> bool:
    return torch.distributed.is_available() and hasattr(torch._C._distributed_c10d, "_dump_fr_trace")
