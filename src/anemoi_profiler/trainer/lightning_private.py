"""Every private Lightning name the profiler relies on, here alone.

Lightning has no public way to see a data fetch or the training step without the callbacks' hooks, to read an
`MLFlowLogger`'s store and key prefix, to reach the user's DDP communication hook before it is registered, or to
tell that it unwrapped a compiled LightningModule. The profiler reads them here: the action names Lightning passes
to `trainer.profiler` (built from its private loop classes, strings inside its loops), the module of its base
`Profiler` and the attributes of
`PRIVATE_ATTRIBUTES`. tests/integration/test_lightning_private.py checks each on every installed Lightning namespace
(`lightning.pytorch` and `pytorch_lightning`), the action names in a real fit. On a Lightning that lacks one, the
figure it feeds is not assessed or found another way, with one warning (`missing`); the fit goes on.
"""

from __future__ import annotations

from typing import Any

from anemoi_profiler.logs import get_logger

log = get_logger(__name__)

# ---- action names Lightning passes to `trainer.profiler` (the loop timer listens for them) ----
TRAIN_FETCH = "[_TrainingEpochLoop].train_dataloader_next"
"""Around every fetch from the training dataloader (`training_epoch_loop.py`)."""
VAL_FETCH = "[_EvaluationLoop].val_next"
"""Around every fetch from a validation dataloader (`evaluation_loop.py`)."""
FETCH_ACTIONS = {TRAIN_FETCH: "train", VAL_FETCH: "val"}

CALLBACK_PREFIX = "[Callback]"
"""Every callback hook runs in `profile("[Callback]<state key>.<hook>")` (`trainer/call.py`)."""
TRAINING_STEP = "run_training_batch"
"""The training step alone, without any callback's hooks (`training_epoch_loop.py`)."""

PROFILER_MODULES = ("lightning.pytorch.profilers.profiler", "pytorch_lightning.profilers.profiler")
"""Where Lightning's base `Profiler` lives, in either namespace."""


def profile_starts_and_stops(profiler: Any) -> bool:
    """Whether `profiler.profile` is Lightning's own `Profiler.profile` (`profilers/profiler.py`): `start`, the
    block, then `stop`, which the loop timer may then call itself. False for a profiler with a `profile` of its
    own, or a Lightning whose base profiler moved: the loop timer then enters `profile` as it is."""
    function = getattr(type(profiler), "profile", None)
    return (
        getattr(function, "__qualname__", "") == "Profiler.profile"
        and getattr(function, "__module__", "") in PROFILER_MODULES
    )


# ---- private attributes ----
PRIVATE_ATTRIBUTES = {
    "_tracking_uri": "loggers.MLFlowLogger",
    "_prefix": "loggers.MLFlowLogger",
    "_ddp_comm_hook": "strategies.DDPStrategy",
    "_compiler_ctx": "LightningModule",
}
"""Each attribute read below, with the class (in either namespace) whose instances carry it."""

_said: set[object] = set()


def missing(name: str, consequence: str) -> None:
    """Say once per process that this Lightning lacks the private `name`, and what that costs."""
    log.warning_once(
        _said,
        name,
        "this Lightning has no %s, a private name the profiler reads "
        "(anemoi_profiler/trainer/lightning_private.py): %s; training goes on",
        name,
        consequence,
    )


def is_mlflow_logger(logger: Any) -> bool:
    """Lightning's MLFlowLogger (either namespace) or anything shaped like it."""
    return type(logger).__name__ == "MLFlowLogger" or (
        hasattr(logger, "run_id") and hasattr(logger, "_tracking_uri") and hasattr(logger, "experiment")
    )


def mlflow_logger_tracking_uri(logger: Any) -> str | None:
    """The store the logger writes to; without `_tracking_uri`, the one of its MLflow client."""
    if hasattr(logger, "_tracking_uri"):
        uri = logger._tracking_uri
        return str(uri) if uri else None
    missing("MLFlowLogger._tracking_uri", "the logger's store is read from its MLflow client instead")
    try:
        uri = logger.experiment.tracking_uri  # Lightning's public client (creating the run), MLflow's public URI
    except Exception:
        return None
    return uri if isinstance(uri, str) and uri else None


def mlflow_logger_prefix(logger: Any) -> str:
    """The prefix the logger puts before its metric keys, which the profiler's keys then share."""
    if hasattr(logger, "_prefix"):
        return str(logger._prefix or "")
    missing("MLFlowLogger._prefix", "the profiler's metric keys go without the logger's prefix")
    return ""


def ddp_comm_hook(strategy: Any) -> Any | None:
    """The user's `ddp_comm_hook`, which a DDP strategy registers at its setup; None without one."""
    if type(strategy).__name__ == "DDPStrategy" and not hasattr(strategy, "_ddp_comm_hook"):
        missing("DDPStrategy._ddp_comm_hook", "a ddp_comm_hook of the user's leaves the collective wait not assessed")
    return getattr(strategy, "_ddp_comm_hook", None)


def replace_ddp_comm_hook(strategy: Any, hook: Any) -> None:
    """Have the strategy register `hook` in place of the user's (see `ddp_comm_hook`)."""
    strategy._ddp_comm_hook = hook


def compiled_by_lightning(model: Any) -> bool:
    """Whether Lightning took a compiled LightningModule apart, keeping its compile settings on it."""
    if hasattr(model, "_compiler_ctx"):
        return model._compiler_ctx is not None
    if hasattr(model, "training_step"):  # a LightningModule
        missing(
            "LightningModule._compiler_ctx",
            "a LightningModule compiled whole is not recognised as compiled (on torch < 2.6 its FLOP count could "
            "then stop it compiling)",
        )
    return False
