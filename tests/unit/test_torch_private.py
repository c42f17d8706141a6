"""The private and recent torch names of profiling/torch_private.py hold for the installed torch.

Run on every stack of the version matrix (ci/matrix): torch 2.4 (the floor), anemoi's 2.10 and the newest. The CUDA
parts are checked for their signatures here (no GPU on CI); they run for real in benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

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


def test_out_of_memory_error_is_what_the_cuda_allocator_raises() -> None:
    assert issubclass(torch.cuda.OutOfMemoryError, torch_private.OutOfMemoryError)


def test_the_out_of_memory_observer_exists_on_cuda_builds() -> None:
    assert hasattr(torch._C, "_cuda_attach_out_of_memory_observer") == torch.backends.cuda.is_built()


def test_the_flight_recorder_dumps_a_gloo_group_where_torch_records_every_backend(tmp_path: Path) -> None:
    size, dump_file = torch_private.flight_recorder_names()
    assert size.endswith("BUFFER_SIZE") and dump_file.endswith("_FILE")
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.distributed.all_reduce(torch.ones(2))
        dump = torch_private.flight_recorder_dump()
    finally:
        torch.distributed.destroy_process_group()
    if size == "TORCH_FR_BUFFER_SIZE":
        entries = pickle.loads(dump)["entries"]
        assert entries[-1]["profiling_name"] == "gloo:all_reduce" and "collective_seq_id" in entries[-1]
    else:
        assert dump is None  # NCCL's recorder only
