"""The private Lightning names of `trainer/lightning_private.py`: each must exist on every installed Lightning
namespace (or this fails, naming it), none is spelled anywhere else in src/, and where one is gone the fit goes
on with one warning and the figure it fed not assessed."""

from __future__ import annotations

import ast
import importlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.clock import is_compiled, loop_timer
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.trainer import lightning_private
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

pytestmark = pytest.mark.stack  # on every tested stack (ci/matrix)

NAMESPACES = ["lightning.pytorch", "pytorch_lightning"]
EXPECTED = [*lightning_private.FETCH_ACTIONS, lightning_private.TRAINING_STEP]
PACKAGE = Path(lightning_private.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def warnings_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-process warnings again."""
    monkeypatch.setattr(lightning_private, "_said", set())


def ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == lightning_private.__name__]


def instance_of(namespace: str, class_path: str, tmp_path: Path) -> Any:
    """A real instance of `<namespace>.<class_path>`, made as a user's code makes it."""
    module_path, _, name = f"{namespace}.{class_path}".rpartition(".")
    cls = getattr(importlib.import_module(module_path), name)
    if name == "MLFlowLogger":
        return cls(experiment_name="private-names", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    return cls()


@pytest.mark.parametrize("namespace", NAMESPACES)
@pytest.mark.parametrize("attribute", sorted(lightning_private.PRIVATE_ATTRIBUTES))
def test_every_private_attribute_exists_on_the_installed_lightning(
    namespace: str, attribute: str, tmp_path: Path
) -> None:

    installed = pytest.importorskip(namespace)
    class_path = lightning_private.PRIVATE_ATTRIBUTES[attribute]
    instance = instance_of(namespace, class_path, tmp_path)
    assert hasattr(instance, attribute), (
        f"{namespace} {installed.__version__}: {class_path} has no `{attribute}` any more; "
        "anemoi_profiler/trainer/lightning_private.py reads it: adapt it to this Lightning"
    )


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_a_module_lightning_took_out_of_torch_compile_is_seen_as_compiled(namespace: str) -> None:
    pytest.importorskip(namespace)
    from_compiled = importlib.import_module(f"{namespace}.utilities.compile").from_compiled
    module = importlib.import_module(namespace).LightningModule()
    assert not lightning_private.compiled_by_lightning(module)
    unwrapped = from_compiled(torch.compile(module))
    assert lightning_private.compiled_by_lightning(unwrapped) and is_compiled(unwrapped)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_a_real_fit_calls_every_action_the_loop_timer_listens_for(namespace: str) -> None:
    pl_namespace = pytest.importorskip(namespace)
    profilers = importlib.import_module(f"{namespace}.profilers")
    seen: set[str] = set()

    class Recording(profilers.PassThroughProfiler):
        def start(self, action_name: str) -> None:
            seen.add(action_name)

    class OneHook(pl_namespace.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            pass

    x = torch.randn(32, 8)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    model = TinyRegressor() if namespace == "lightning.pytorch" else _legacy_module(pl_namespace)
    fit_trainer = pl_namespace.Trainer(
        max_steps=3,
        limit_val_batches=1,
        val_check_interval=2,
        num_sanity_val_steps=0,
        profiler=Recording(),
        callbacks=[OneHook()],
        logger=False,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    fit_trainer.fit(model, data, data)

    assert [action for action in EXPECTED if action not in seen] == [], (
        f"{namespace} no longer calls these profiler actions; trainer/lightning_private.py listens for them"
    )
    hooks = [action for action in seen if action.startswith(lightning_private.CALLBACK_PREFIX)]
    assert any("OneHook" in action and action.endswith(".on_train_batch_end") for action in hooks), hooks


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_lightnings_own_profilers_profile_by_start_and_stop(namespace: str, tmp_path: Path) -> None:
    """The loop timer calls `start`/`stop` itself around a timed callback hook where a profiler's `profile` is
    Lightning's base one; a profiler with its own `profile` is entered as it is."""
    pytest.importorskip(namespace)
    profilers = importlib.import_module(f"{namespace}.profilers")
    assert lightning_private.profile_starts_and_stops(profilers.PassThroughProfiler())
    assert lightning_private.profile_starts_and_stops(profilers.SimpleProfiler(dirpath=tmp_path, filename="p"))

    class OwnProfile(profilers.PassThroughProfiler):
        def profile(self, action_name: str) -> Any:
            return super().profile(action_name)

    assert not lightning_private.profile_starts_and_stops(OwnProfile())


def test_no_other_module_reaches_a_private_lightning_name() -> None:
    private = set(lightning_private.PRIVATE_ATTRIBUTES)
    loop_classes = ("_TrainingEpochLoop", "_EvaluationLoop")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "lightning_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            reached = (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ) or (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and (node.value in private or any(name in node.value for name in loop_classes))
            )
            if reached:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == [], f"private Lightning names outside trainer/lightning_private.py: {found}"


def test_a_logger_without_its_private_attributes_still_names_its_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without `_tracking_uri` the store comes from the logger's MLflow client (made when Lightning first used it);
    without `_prefix` the keys go unprefixed. One warning each, however often they are read."""
    from lightning.pytorch.loggers import MLFlowLogger

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = MLFlowLogger(experiment_name="private-names", tracking_uri=uri, prefix="fit")
    assert (lightning_private.mlflow_logger_tracking_uri(logger), lightning_private.mlflow_logger_prefix(logger)) == (
        uri,
        "fit",
    )
    assert logger.experiment is not None  # Lightning made its client
    del logger._tracking_uri, logger._prefix
    # MLflow 2.x's sqlite store set-up (alembic's logging config) takes pytest's handler off the root logger: then
    # on the module's own logger.
    module_log = logging.getLogger(lightning_private.__name__)
    if caplog.handler not in logging.getLogger().handlers:
        module_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=lightning_private.__name__):
            for _ in range(2):
                assert lightning_private.mlflow_logger_tracking_uri(logger) == uri
                assert lightning_private.mlflow_logger_prefix(logger) == ""
    finally:
        module_log.removeHandler(caplog.handler)
    assert [record.getMessage().split(",")[0] for record in ours(caplog)] == [
        "anemoi-profiler: this Lightning has no MLFlowLogger._tracking_uri",
        "anemoi-profiler: this Lightning has no MLFlowLogger._prefix",
    ]


def test_a_strategy_and_a_module_without_theirs_degrade(caplog: pytest.LogCaptureFixture) -> None:
    from lightning.pytorch.strategies import DDPStrategy

    strategy, module = DDPStrategy(), TinyRegressor()
    del strategy._ddp_comm_hook, module._compiler_ctx
    with caplog.at_level(logging.WARNING, logger=lightning_private.__name__):
        assert lightning_private.ddp_comm_hook(strategy) is None
        assert not lightning_private.compiled_by_lightning(module)
    warned = ours(caplog)
    assert len(warned) == 2
    assert "collective wait not assessed" in warned[0].getMessage()


def test_renamed_profiler_actions_leave_the_data_wait_and_the_flops_not_assessed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A real fit on a Lightning that (as far as the profiler knows) renamed its fetch and training-step actions:
    the fit ends, one warning names each action, the report says the data wait is not assessed (instead of 0 %)
    and no MFU is logged."""
    monkeypatch.setattr(loop_timer, "FETCH_ACTIONS", {"[_Renamed].next": "train"})
    monkeypatch.setattr(lightning_private, "TRAINING_STEP", "[_Renamed].run_training_batch")
    config = ProfilerConfig.load(
        None,
        [
            f"output_dir={tmp_path / 'runs'}",
            "tracking.enabled=false",
            "report.console=false",
            "report.html=false",
            "system.enabled=false",
            "log_every_n_steps=5",
            "throughput.warmup_steps=3",
            "throughput.device_peak_flops=1e12",
        ],
    )
    train, val = loaders(n_train=16 * 20)
    fit_trainer = trainer(build_callbacks(config), max_steps=20)
    with caplog.at_level(logging.WARNING, logger=lightning_private.__name__):
        fit_trainer.fit(TinyRegressor(), train, val)

    assert fit_trainer.state.finished
    warned = [record.getMessage() for record in ours(caplog)]
    assert len(warned) == 2
    assert any("run_training_batch" in message and "MFU are not assessed" in message for message in warned)
    assert any(lightning_private.TRAIN_FETCH in message for message in warned)
    (run_dir,) = run_folders(tmp_path / "runs")
    section = json.loads((run_dir / "report.json").read_text())["sections"]["Step time and memory"]["data"]
    assert section["train/dataloader_wait_share"] == "not assessed"
    assert names.TRAIN_MFU not in json.loads((run_dir / "metrics.json").read_text())


def _legacy_module(pl_namespace: Any) -> Any:
    """TinyRegressor's training and validation steps on a `pytorch_lightning.LightningModule`."""

    class Legacy(pl_namespace.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.training_step(batch, batch_idx)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Legacy()
