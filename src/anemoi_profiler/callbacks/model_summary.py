"""torchinfo summary of the model on its first real training batch, leaving the model exactly as it was.

The batch is taken in `on_train_batch_start` of the first training batch: it is already on the device with
the user's transforms applied, and taking it costs no dataloader iteration (iterating the train dataloader
ourselves would draw a shuffle seed from the global RNG, start workers and consume streamed datasets).
The summary runs one extra forward pass on rank 0, in eval mode under `torch.no_grad()` and the trainer's
precision context. Afterwards every submodule's train/eval flag and the CPU and CUDA RNG states are restored;
dtypes and devices are never changed (torchinfo is always given the input, so it moves nothing), no
gradients are made and torchinfo's hooks are removed. State a forward pass mutates by itself, outside
parameters, BatchNorm-style buffers and the RNG (counters, caches, `self.log`), is not rolled back. A
compiled model runs it eagerly (`clock.eager`): it adds no graph, recompile or graph break to the training's.

How the model is called from a batch (the first call that matches `forward`'s signature and runs wins):
- `input_fn(batch)` when given: a tuple is passed as positional arguments, a dict as keyword arguments,
  anything else as the one argument (return `(a_dict,)` for a forward that takes one dict);
- a dict batch: `forward(**the keys named like forward's parameters)`, else `forward(batch)`;
- a tuple or list batch: its leading elements, one per required positional parameter of forward (at least
  one), as in `x, y = batch; forward(x)`; when forward takes one argument, then also `forward(batch)`;
- anything else (a tensor): `forward(batch)`.
When no call works, or a forward pass on rank 0 alone could wait on the other ranks (a sharding strategy, several
ranks per sample as under tensor parallelism or anemoi's model groups, DTensor parameters, or any multi-rank
strategy other than plain DDP), `model_summary.txt` holds the parameter counts per top-level module and says why.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torchinfo
from torch import nn
from torchinfo import torchinfo as torchinfo_module

from anemoi_profiler.callbacks.base import ProfilerCallback, guarded
from anemoi_profiler.clock import eager
from anemoi_profiler.config import ConfigSource, ProfilerConfig
from anemoi_profiler.distributed.parallelism import GROUP_ATTRIBUTES, Parallelism
from anemoi_profiler.logs import get_logger
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.run_files.layout import MODEL_SUMMARY_FILE
from anemoi_profiler.trainer import trainer_info

log = get_logger(__name__)

DESCRIPTION_CHARS = 300
COLUMNS = ("input_size", "output_size", "num_params", "mult_adds", "trainable")
PLAIN_DATA_PARALLEL = ("DDPStrategy",)
"""Strategies under which the LightningModule's own forward runs no collective (the model is whole on every rank;
DDP's buffer broadcast is in its wrapper's forward, which the summary does not call, and its all-reduce in
backward): the summary's forward on rank 0 alone is safe under them."""
_LIGHTNING_PACKAGES = ("lightning.", "pytorch_lightning.")


class ModelCallError(Exception):
    """The model could not be called with the batch; the message says why, for the summary file."""


@dataclass
class ModelCall:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rule: str

    def describe(self) -> str:
        parts = [describe_value(value) for value in self.args]
        parts += [f"{name}={describe_value(value)}" for name, value in self.kwargs.items()]
        text = f"forward({', '.join(parts)})"
        return text if len(text) <= DESCRIPTION_CHARS else text[: DESCRIPTION_CHARS - 4] + "...)"


@dataclass
class ModelSummary:
    """What `model_summary.txt`, the MLflow params and the report show."""

    model_name: str
    total_params: int
    trainable_params: int
    text: str
    mult_adds: int | None = None
    call: str | None = None
    static_reason: str | None = None

    def params(self) -> dict[str, int]:
        params = {"model/total_params": self.total_params, "model/trainable_params": self.trainable_params}
        if self.mult_adds is not None:
            params["model/mult_adds"] = self.mult_adds
        return params


def summarize_model(
    model: nn.Module,
    batch: Any,
    depth: int = 3,
    input_fn: Callable[[Any], Any] | None = None,
    forward_context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> ModelSummary:
    """torchinfo summary on `batch`, or the static summary with the reason; never raises for a model problem."""
    try:
        calls = [call_from_input_fn(input_fn(batch))] if input_fn else candidate_calls(model, batch)
    except ModelCallError as reason:
        return _static_because(model, str(reason))
    except Exception as error:
        return _static_because(model, f"input_fn raised {type(error).__name__}: {error}")
    failures = []
    for call in calls:
        try:
            with preserved_model_state(model), eager(), (forward_context or contextlib.nullcontext)():
                statistics = _run_torchinfo(model, call, depth)
            mult_adds, table = int(statistics.total_mult_adds), str(statistics)
        except Exception as error:
            cause = error.__cause__ or error
            failures.append(f"{call.describe()} ({call.rule}) raised {type(cause).__name__}: {str(cause)[:500]}")
            if isinstance(cause, torch.cuda.OutOfMemoryError):
                break  # another call would run out of memory too
            continue
        total, trainable = count_parameters(model)
        header = [
            f"Model summary of {type(model).__name__}: torchinfo on the first training batch",
            f"called as {call.describe()} ({call.rule})",
            f"depth {depth}; one forward pass in eval mode under no_grad; model state restored afterwards",
            f"total params {total:,}, trainable {trainable:,}, mult-adds {mult_adds:,} per forward",
        ]
        return ModelSummary(
            type(model).__name__,
            total,
            trainable,
            "\n".join([*header, "", table]) + "\n",
            mult_adds=mult_adds,
            call=call.describe(),
        )
    hint = "" if input_fn else "; pass input_fn(batch) -> the model's inputs"
    return _static_because(model, "; ".join(failures) + hint)


def _static_because(model: nn.Module, reason: str) -> ModelSummary:
    log.warning("model summary without a forward pass (parameter counts only): %s", reason)
    return static_model_summary(model, reason)


def _run_torchinfo(model: nn.Module, call: ModelCall, depth: int) -> Any:
    """Always with input_data, so torchinfo moves neither model nor inputs; its cache entry is dropped after."""
    # torchinfo spreads a list as positional and a dict as keyword arguments; a call has one or the other.
    input_data: Any = list(call.args) if call.args else dict(call.kwargs)
    try:
        return torchinfo.summary(
            model,
            input_data=input_data,
            depth=depth,
            col_names=COLUMNS,
            row_settings=("depth", "var_names"),
            mode="eval",
            verbose=0,
        )
    finally:
        # torchinfo keeps every summarized forward pass in a module-level dict, and with it the model.
        getattr(torchinfo_module, "_cached_forward_pass", {}).pop(type(model).__name__, None)


@contextlib.contextmanager
def preserved_model_state(model: nn.Module) -> Iterator[None]:
    """Restore each submodule's train/eval flag (torchinfo resets them all to the root's) and the RNG states."""
    modes = [(module, module.training) for module in model.modules()]
    cuda_devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=cuda_devices):
            yield
    finally:
        for module, training in modes:
            module.training = training


def candidate_calls(model: nn.Module, batch: Any) -> list[ModelCall]:
    """The calls the module docstring lists, in order, keeping those that fit forward's signature."""
    if not defines_forward(model):
        raise ModelCallError(
            f"{type(model).__name__} does not define forward(); pass input_fn(batch) -> inputs of the module to call"
        )
    signature = _forward_signature(model)
    calls: list[ModelCall] = []
    if isinstance(batch, Mapping):
        names = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        named = {name: batch[name] for name in names if name in batch}
        if named:
            calls.append(ModelCall((), named, "batch keys named like forward's parameters"))
        calls.append(ModelCall((batch,), {}, "the whole batch"))
    elif isinstance(batch, tuple | list):
        required = [
            p
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        count = max(1, len(required))
        if count <= len(batch):
            rule = "all batch elements" if count == len(batch) else f"the first {count} of {len(batch)} batch elements"
            calls.append(ModelCall(tuple(batch[:count]), {}, rule))
        if count == 1 and len(batch) > 1:
            calls.append(ModelCall((batch,), {}, "the whole batch"))
    else:
        calls.append(ModelCall((batch,), {}, "the whole batch"))
    fitting = [call for call in calls if _binds(signature, call)]
    if not fitting:
        raise ModelCallError(
            f"no call of forward{signature} fits a batch of type {type(batch).__name__}; "
            "pass input_fn(batch) -> the model's inputs"
        )
    return fitting


def call_from_input_fn(inputs: Any) -> ModelCall:
    if isinstance(inputs, tuple):
        return ModelCall(inputs, {}, "input_fn's tuple as positional arguments")
    if isinstance(inputs, Mapping):
        return ModelCall((), dict(inputs), "input_fn's dict as keyword arguments")
    return ModelCall((inputs,), {}, "input_fn's value as the argument")


def defines_forward(model: nn.Module) -> bool:
    """False when forward is torch's or Lightning's placeholder (the model is called inside training_step)."""
    forward = type(model).forward
    return forward is not nn.Module.forward and not str(getattr(forward, "__module__", "")).startswith(
        _LIGHTNING_PACKAGES
    )


def _forward_signature(model: nn.Module) -> inspect.Signature:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C++ forward: accept any call and let the forward decide
        return inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])


def _binds(signature: inspect.Signature, call: ModelCall) -> bool:
    try:
        signature.bind(*call.args, **call.kwargs)
    except TypeError:
        return False
    return True


def describe_value(value: Any) -> str:
    """Shapes and dtypes instead of values: `float32[8, 16]`, `{'x': float32[8, 16]}`."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key!r}: {describe_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, tuple | list):
        inner = ", ".join(describe_value(item) for item in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return type(value).__name__


def count_parameters(module: nn.Module, recurse: bool = True) -> tuple[int, int]:
    """(total, trainable) over distinct parameters, tied weights once; uninitialized lazy ones are left out."""
    params = [p for p in module.parameters(recurse=recurse) if not nn.parameter.is_lazy(p)]
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def static_model_summary(model: nn.Module, reason: str) -> ModelSummary:
    """Parameter counts per top-level module, without running the model."""
    rows = [(name, type(child).__name__, *count_parameters(child)) for name, child in model.named_children()]
    own = count_parameters(model, recurse=False)
    if own[0]:
        rows.append(("(own parameters)", type(model).__name__, *own))
    total, trainable = count_parameters(model)
    width = max([len(row[0]) for row in rows] + [len("module")])
    type_width = max([len(row[1]) for row in rows] + [len("type")])
    lines = [
        f"Model summary of {type(model).__name__}: static (no forward pass)",
        f"why: {reason}",
        "",
        f"{'module':<{width}}  {'type':<{type_width}}  {'params':>15}  {'trainable':>15}",
        *(f"{n:<{width}}  {t:<{type_width}}  {p:>15,}  {tr:>15,}" for n, t, p, tr in rows),
        "",
        f"Total params: {total:,}",
        f"Trainable params: {trainable:,}",
        f"Non-trainable params: {total - trainable:,}",
    ]
    return ModelSummary(type(model).__name__, total, trainable, "\n".join(lines) + "\n", static_reason=reason)


def forward_collectives_reason(trainer: Any, parallelism: Parallelism) -> str | None:
    """Why a forward pass on rank 0 alone could wait on the other ranks (and hang or mismatch their collectives),
    or None where the forward is known to be local: one process, or plain DDP, whose model is whole on every
    rank and whose collectives run in backward."""
    sharded = trainer_info.sharding_strategy(trainer)
    if sharded:
        return f"{sharded} shards the model: a forward pass on rank 0 alone would wait for the other ranks"
    if parallelism.world_size <= 1:
        return None
    if parallelism.ranks_per_replica > 1:
        return (
            f"{parallelism.ranks_per_replica} ranks work on each sample ({parallelism.source}): their forward "
            "exchanges activations, and a forward pass on rank 0 alone would wait for the others"
        )
    name = trainer_info.strategy_name(trainer)
    strategy = getattr(trainer, "strategy", None)
    in_groups_of_one = any(getattr(strategy, attribute, None) == 1 for attribute in GROUP_ATTRIBUTES)
    if name not in PLAIN_DATA_PARALLEL and not in_groups_of_one:  # anemoi's groups of one rank exchange nothing
        return (
            f"{name} may run collectives in forward (only {', '.join(PLAIN_DATA_PARALLEL)} is known not to), and a "
            "forward pass on rank 0 alone could wait for the other ranks"
        )
    return None


class ModelSummaryCallback(ProfilerCallback):
    """Writes `model_summary.txt` and logs `model/total_params`, `model/trainable_params`, `model/mult_adds`.

    `input_fn(batch)` returns the model's inputs when the default rule (module docstring) does not fit.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
        input_fn: Turns a batch into the model's forward arguments (a tuple, a dict, or one input); None: the
            default rule. Where the forward fails, the summary keeps the parameter counts and says why.
    """

    def __init__(
        self,
        config: ProfilerConfig | ConfigSource | None = None,
        session: ProfilerSession | None = None,
        input_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(config, session)
        self.input_fn = input_fn
        self.result: ModelSummary | None = None
        self.pending = False

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        self.result = None
        self.pending = self.session.is_global_zero

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.pending:
            self.pending = False
            self._record(self._summary_on_batch(trainer, pl_module, batch))

    def _summary_on_batch(self, trainer: Any, pl_module: Any, batch: Any) -> ModelSummary:
        reason = forward_collectives_reason(trainer, self.session.parallelism)
        if reason:
            return static_model_summary(pl_module, f"{reason}; parameter counts are this rank's view")
        precision = getattr(trainer, "precision_plugin", None)
        return summarize_model(
            pl_module,
            batch,
            depth=self.config.model_summary.depth,
            input_fn=self.input_fn,
            forward_context=getattr(precision, "forward_context", None),
        )

    def _record(self, summary: ModelSummary) -> None:
        self.result = summary
        assert self.session.run_dir is not None
        (self.session.run_dir / MODEL_SUMMARY_FILE).write_text(summary.text)
        self.session.log_params(summary.params())

    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        if self.pending:  # a validate/test run, or a fit that stopped before its first training batch
            self.pending = False
            model = getattr(trainer, "lightning_module", None)
            if model is not None:
                self._record(static_model_summary(model, "no training batch was seen"))
        if self.result is None:
            return [], {}
        summary = self.result
        values: dict[str, tuple[Any, str]] = {
            "model": (summary.model_name, ""),
            "total params": (summary.total_params, ""),
            "trainable params": (summary.trainable_params, ""),
        }
        if summary.mult_adds is not None:
            values["mult-adds per forward"] = (summary.mult_adds, "")
            values["called as"] = (summary.call, "")
        else:
            values["static summary because"] = (summary.static_reason, "")
        return [ReportSection.key_values("Model summary", values, "Full table in model_summary.txt.")], {}
