"""The profiler's own passes through a compiled model run eagerly, so that they cost its compilation nothing.

Two of them touch the user's model: FLOP counting on the first training batch (torch's `FlopCounterMode`) and
the model summary's extra forward pass (torchinfo, eval mode, no_grad, hooks on every module). Left to
`torch.compile`, the summary compiles graphs of its own and breaks them on torchinfo's hooks; and a model's
first call under `FlopCounterMode`, a dispatch mode, makes dynamo skip the model's code for good: it never
compiles and trains eagerly for the whole run. Under `torch.compiler.set_stance("force_eager")` (torch 2.6)
both run as plain eager code, and the model compiles on its next call exactly as it would have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from anemoi_profiler.trainer.lightning_private import compiled_by_lightning


def can_run_eagerly() -> bool:
    """Whether this torch can set the compiler aside for a while (`torch.compiler.set_stance`, torch 2.6)."""
    return hasattr(getattr(torch, "compiler", None), "set_stance")


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Ignore `torch.compile` inside the block (where torch can; see `can_run_eagerly`)."""
    if not can_run_eagerly():
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield


def is_compiled(model: Any) -> bool:
    """Whether `model` or one of its submodules was wrapped by `torch.compile` (or Lightning took a compiled
    LightningModule apart, leaving its compile settings on it)."""
    if compiled_by_lightning(model):
        return True
    modules = model.modules() if isinstance(model, nn.Module) else []
    return any(type(module).__name__ == "OptimizedModule" for module in modules)
