"""The private and recent torch names of profiling/torch_private.py hold for the installed torch.

Run on every stack of the version matrix (ci/matrix): torch 2.4 (the floor), anemoi's 2.10 and the newest. The CUDA
parts are checked for their signatures here (no GPU on CI); they run for real in benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from anemoi_profiler.profiling import torch_private

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)


def test_the_activity_type_of_kineto_events_arrives_in_the_version_named() -> None:
    expected = torch_private.torch_version() >= torch_private.KINETO_ACTIVITY_TYPE_FROM
    assert torch_private.kineto_events_have_activity_type() == expected


def test_a_cpu_window_s_events_carry_every_field_the_summary_reads() -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(8, 8).matmul(torch.ones(8, 8))
    events = torch_private.kineto_results(prof.profiler).events()
    assert events
    fields = ["start_ns", "duration_ns", "name", "correlation_id", "device_resource_id"]
    if torch_private.kineto_events_have_activity_type():
        fields.append("activity_type")
    for field in fields:
        getattr(events[0], field)()
    assert any("matmul" in event.name() for event in events)


def test_the_cuda_sync_events_config_is_built() -> None:
    assert torch_private.cuda_sync_events_config() is not None


def test_the_memory_history_functions_take_the_arguments_used() -> None:
    parameters = inspect.signature(torch.cuda.memory._record_memory_history).parameters
    assert {"enabled", "context", "stacks", "max_entries"} <= set(parameters)
    assert callable(torch.cuda.memory._snapshot)
