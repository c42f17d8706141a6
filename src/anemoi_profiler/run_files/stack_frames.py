"""A thread's Python stack read as a phase of the training loop and a frame of the user's code.

Torch-free and in `run_files/`, so that both the training process (`postmortem.stacks`, from live frames) and
the MLflow sender (from faulthandler's dump of a process that holds the interpreter lock) read a stack the same
way. The phase is the innermost frame that names one (a collective of `torch.distributed`, the DataLoader, the
optimizer, autograd's backward, a checkpoint save, the user's `training_step`), so a rank sleeping in its
`training_step` and a rank inside the backward pass that waits for the gradient all-reduce read differently.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable
from typing import Any

COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather",
        "gather_object",
        "scatter",
        "send",
        "recv",
        "wait",
    }
)
BACKWARD = "backward"
DATA_FETCH = "data fetch"
FORWARD = "forward (training_step)"
VALIDATION = "validation"
_LIBRARIES = ("torch", "lightning", "pytorch_lightning", "anemoi_profiler", "numpy")
_STDLIB_ROOTS = tuple({path for key, path in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib")})

Frame = dict[str, Any]
"""`{"file", "line", "function", "code"}`, as `traceback` reads a frame."""


def phase_of(frames: list[Frame]) -> str:
    """The phase of a training thread's stack (outermost first): the innermost frame that names one."""
    stage = VALIDATION if any(_in_validation(frame) for frame in frames) else ""
    for frame in reversed(frames):
        phase = _phase(frame)
        if phase is not None:
            return f"{stage}: {phase}" if stage and phase != VALIDATION else phase
    return stage or "elsewhere"


def _phase(frame: Frame) -> str | None:
    path, function = frame["file"].replace("\\", "/"), frame["function"]
    if "/torch/distributed/" in path and function in COLLECTIVES:
        return f"collective ({function})"
    if "/torch/utils/data/" in path or (function in ("fetch", "__next__") and "/loops/fetchers" in path):
        return DATA_FETCH
    if "/torch/optim/" in path or function == "optimizer_step":
        return "optimizer"
    if "/torch/autograd/" in path or function in ("backward", "manual_backward"):
        return BACKWARD
    if function == "save_checkpoint" or "/torch/serialization" in path:
        return "checkpoint"
    if "/anemoi_profiler/" in path:
        return "the profiler's own work"
    if function == "training_step":
        return FORWARD
    if function in ("validation_step", "test_step"):
        return VALIDATION
    return None


def _in_validation(frame: Frame) -> bool:
    return frame["function"] in ("validation_step", "_evaluation_step") or frame["file"].endswith("evaluation_loop.py")


def user_frame(frames: Iterable[Frame]) -> Frame | None:
    """The innermost frame of the user's code (not the standard library, torch, Lightning or the profiler)."""
    for frame in reversed(list(frames)):
        if not _is_library(frame["file"]):
            return frame
    return None


def _is_library(path: str) -> bool:
    normal = path.replace("\\", "/")
    if path.startswith("<") or any(f"/{name}/" in normal for name in _LIBRARIES):
        return True
    installed = "/site-packages/" in normal or "/dist-packages/" in normal  # the user's packages may be there
    return not installed and any(path.startswith(root) for root in _STDLIB_ROOTS)


def describe(frame: Frame | None) -> str:
    """`training_step (train.py:42)`."""
    if frame is None:
        return "n/a"
    return f"{frame['function']} ({frame['file'].rsplit('/', 1)[-1]}:{frame['line']})"
