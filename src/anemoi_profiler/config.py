"""One configuration tree for every callback: OmegaConf structured config with presets, YAML and overrides.

`ProfilerConfig.load` is the single entry point. Every error (unknown key, wrong type, value out of range,
YAML syntax) becomes a `ConfigError` that names the key and what is allowed, so a typo in a 3-day job's
config fails in the first second with a message, not with a traceback an hour later.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

PRESETS = ("simple", "detailed")


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""


@dataclass
class TrackingConfig:
    """Where metrics and artifacts go (see `tracking.uri` resolution in the README)."""

    enabled: bool = True
    # None: the trainer's MLFlowLogger, else $MLFLOW_TRACKING_URI, else sqlite:///<output_dir>/mlflow.db.
    uri: str | None = None
    experiment: str = "anemoi-profiler"
    run_name: str | None = None
    # How often the background thread sends queued metrics; the training thread never waits for it.
    flush_interval_s: float = 5.0
    # How often sending is retried (spool replayed) while the server does not answer.
    retry_interval_s: float = 30.0
    # Longest time the end of a run waits for MLflow before leaving the rest in the spool.
    close_timeout_s: float = 30.0
    upload_artifacts: bool = True


@dataclass
class ThroughputConfig:
    """Samples/batches/items per second and MFU, measured without a device sync per step."""

    enabled: bool = True
    # Batches at the start of the fit that are not measured (compilation, allocator and cache warmup).
    warmup_steps: int = 5
    # "package.module:function" taking a batch and returning its number of items (tokens, points, ...).
    length_fn: str | None = None
    # "package.module:function" taking a batch and returning its number of samples (default: dim 0).
    batch_size_fn: str | None = None
    # Forward+backward FLOPs of one sample; None measures them once with torch's FlopCounterMode
    # when `measure_flops` is on and the device peak is known.
    flops_per_sample: float | None = None
    measure_flops: bool = True
    # Peak dense FLOP/s of one device for the training precision; None looks it up (H100/H200/A100/L4/B200 ...).
    device_peak_flops: float | None = None


@dataclass
class TimingConfig:
    """Step time, dataloader wait and peak memory per log interval."""

    enabled: bool = True


@dataclass
class SystemConfig:
    """CPU, memory, disk, network and per-GPU metrics from a background thread, under MLflow's names."""

    enabled: bool = True
    interval_s: float = 10.0
    gpus: bool = True
    disk_path: str = "/"


@dataclass
class WindowConfig:
    """A torch.profiler schedule: skip `skip_first` batches, then `repeat` cycles of wait/warmup/active.

    Only `active` batches are recorded; `repeat: 0` repeats until the stage ends.
    """

    skip_first: int = 10
    wait: int = 5
    warmup: int = 2
    active: int = 3
    repeat: int = 1


@dataclass
class TorchProfilerConfig:
    """Profiling windows with torch.profiler: traces, time report, memory report."""

    enabled: bool = False
    train: WindowConfig = field(default_factory=WindowConfig)
    # Validation batches are counted per validation run; the sanity check is never profiled.
    validation: bool = True
    val: WindowConfig = field(default_factory=lambda: WindowConfig(skip_first=0, wait=0, warmup=1, active=2, repeat=1))
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    # Record CUDA synchronization events, which HTA's critical-path analysis needs.
    sync_events: bool = True
    traces: bool = True
    # Warn before a window whose trace would exceed this many MB (uncompressed JSON); skip writing above 4x.
    trace_budget_mb: float = 300.0
    # Upload traces to MLflow when their total stays below this; the run folder always keeps them.
    upload_traces_max_mb: float = 200.0
    time_report: bool = True
    memory_report: bool = True
    # memory/timeline_rank<r>.html via export_memory_timeline (CUDA only; slow on long windows).
    memory_timeline: bool = False
    top_n: int = 30


@dataclass
class MemorySnapshotConfig:
    """CUDA caching-allocator snapshot (open at pytorch.org/memory_viz); also dumped when the run dies."""

    enabled: bool = False
    # Record allocation history from this training batch, for `steps` batches.
    start_step: int = 5
    steps: int = 3
    max_entries: int = 100000
    on_exception: bool = True


@dataclass
class ModelSummaryConfig:
    """torchinfo summary of the model on a real batch (rank 0)."""

    enabled: bool = True
    depth: int = 3


@dataclass
class ReportConfig:
    """The end-of-run report: which renderings to make."""

    console: bool = True
    txt: bool = True
    json: bool = True


@dataclass
class ProfilerConfig:
    """Root of the configuration. Keys are documented in docs/configuration.md."""

    # Run folders are created below this: <output_dir>/<YYYYmmdd-HHMMSS>_<config hash>/.
    output_dir: str = "profiler_runs"
    # Rates, times and peaks are aggregated and logged every this many training batches.
    log_every_n_steps: int = 50
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    profiler: TorchProfilerConfig = field(default_factory=TorchProfilerConfig)
    memory_snapshot: MemorySnapshotConfig = field(default_factory=MemorySnapshotConfig)
    model_summary: ModelSummaryConfig = field(default_factory=ModelSummaryConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    @classmethod
    def load(
        cls, source: str | Path | Mapping[str, Any] | None = None, overrides: Iterable[str] = ()
    ) -> ProfilerConfig:
        """Build a validated config from defaults, a preset name or YAML path (or a mapping), and overrides.

        `overrides` are `key=value` strings such as `"throughput.warmup_steps=10"`.
        """
        layers: list[DictConfig] = [OmegaConf.structured(cls)]
        if source is not None:
            layers.append(_load_source(source))
        overrides = list(overrides)
        if overrides:
            layers.append(_parse_overrides(overrides))
        try:
            merged = OmegaConf.merge(*layers)
            config = OmegaConf.to_object(merged)
        except OmegaConfBaseException as error:
            raise ConfigError(_explain(error)) from None
        assert isinstance(config, cls)
        config.validate()
        return config

    def validate(self) -> None:
        """Check values that types alone cannot; raise ConfigError naming the key."""
        checks = [
            ("log_every_n_steps", self.log_every_n_steps >= 1, "an integer >= 1"),
            ("throughput.warmup_steps", self.throughput.warmup_steps >= 0, "an integer >= 0"),
            ("system.interval_s", self.system.interval_s > 0, "a number of seconds > 0"),
            ("tracking.flush_interval_s", self.tracking.flush_interval_s > 0, "a number of seconds > 0"),
            ("tracking.retry_interval_s", self.tracking.retry_interval_s > 0, "a number of seconds > 0"),
            ("tracking.close_timeout_s", self.tracking.close_timeout_s >= 0, "a number of seconds >= 0"),
            ("tracking.experiment", bool(self.tracking.experiment.strip()), "a non-empty name"),
            ("output_dir", bool(self.output_dir.strip()), "a non-empty path"),
        ]
        for stage in ("train", "val"):
            window = getattr(self.profiler, stage)
            for name in ("skip_first", "wait", "warmup", "repeat"):
                checks.append((f"profiler.{stage}.{name}", getattr(window, name) >= 0, "an integer >= 0"))
            checks.append((f"profiler.{stage}.active", window.active >= 1, "an integer >= 1"))
        checks += [
            ("profiler.trace_budget_mb", self.profiler.trace_budget_mb > 0, "a number of MB > 0"),
            ("profiler.upload_traces_max_mb", self.profiler.upload_traces_max_mb >= 0, "a number of MB >= 0"),
            ("profiler.top_n", self.profiler.top_n >= 1, "an integer >= 1"),
            ("memory_snapshot.start_step", self.memory_snapshot.start_step >= 0, "an integer >= 0"),
            ("memory_snapshot.steps", self.memory_snapshot.steps >= 1, "an integer >= 1"),
            ("memory_snapshot.max_entries", self.memory_snapshot.max_entries >= 1, "an integer >= 1"),
            ("model_summary.depth", self.model_summary.depth >= 0, "an integer >= 0"),
        ]
        for name in ("flops_per_sample", "device_peak_flops"):
            value = getattr(self.throughput, name)
            checks.append((f"throughput.{name}", value is None or value > 0, "null or a number > 0"))
        for name in ("length_fn", "batch_size_fn"):
            value = getattr(self.throughput, name)
            checks.append((f"throughput.{name}", value is None or ":" in value, "null or 'package.module:function'"))
        for key, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"{key}: got {_value_at(self, key)!r}, expected {allowed}")

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.structured(self))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """8 hex digits identifying the resolved config, used in run folder names."""
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()[:8]


def preset_path(name: str) -> Path:
    return Path(str(resources.files("anemoi_profiler") / "presets" / f"{name}.yaml"))


def _load_source(source: str | Path | Mapping[str, Any]) -> DictConfig:
    if isinstance(source, Mapping):
        return OmegaConf.create(dict(source))
    path = preset_path(str(source)) if str(source) in PRESETS else Path(source)
    if not path.is_file():
        raise ConfigError(f"config {str(source)!r}: no such file, and not a preset (presets: {', '.join(PRESETS)})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return OmegaConf.create(data)


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"override {item!r}: expected key=value, e.g. throughput.warmup_steps=10")
    try:
        return OmegaConf.from_dotlist(overrides)
    except OmegaConfBaseException as error:
        raise ConfigError(f"overrides {overrides}: {error}") from None


def _explain(error: OmegaConfBaseException) -> str:
    """Turn an OmegaConf error into one line naming the key and what is allowed there."""
    key = getattr(error, "full_key", None) or "config"
    if isinstance(error, ConfigKeyError):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        return f"{key}: unknown key; allowed keys{' in ' + parent if parent else ''}: {_allowed_keys(parent)}"
    if isinstance(error, ValidationError):
        return f"{key}: {_first_line(str(error))}; expected {_expected_type(key)}"
    return f"{key}: {_first_line(str(error))}"


def _allowed_keys(parent: str) -> str:
    node: Any = ProfilerConfig()
    for part in filter(None, parent.split(".")):
        node = getattr(node, part, None)
    if not dataclasses.is_dataclass(node):
        return "(none: this key takes a value)"
    return ", ".join(f.name for f in dataclasses.fields(node))


def _expected_type(key: str) -> str:
    node: Any = ProfilerConfig
    annotation = "a value of the documented type"
    for part in key.split("."):
        hints = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in hints:
            break
        annotation = str(hints[part].type)
        node = hints[part].default_factory() if callable(hints[part].default_factory) else None
    return annotation.replace("None", "null")


def _value_at(config: ProfilerConfig, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
