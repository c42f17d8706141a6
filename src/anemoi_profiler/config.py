"""One configuration tree for every callback: OmegaConf structured config with presets, YAML and overrides.

`ProfilerConfig.load` is the single entry point. Every error (unknown key, wrong type, value out of range,
YAML syntax) becomes a `ConfigError` that names the key and what is allowed, so a typo in a 3-day job's
config fails in the first second with a message, not with a traceback an hour later.

It reads a section of a Hydra or OmegaConf tree as it is handed over (`cfg.diagnostics.profiler`, a
`DictConfig` whose interpolations point elsewhere in the user's tree), and `register_hydra_configs` puts the
schema and the presets into Hydra's ConfigStore, so that typos fail in the user's tree too (docs/hydra.md).
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
ITEM_COUNTING = ("replica", "rank")

ConfigSource = str | Path | Mapping[str, Any]
"""What `ProfilerConfig.load` reads: a preset name, a YAML path, or a mapping (an OmegaConf `DictConfig` too)."""


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""


def _opt(default: Any, help: str) -> Any:
    """A config field with its help text; docs/configuration.md is generated from these."""
    if isinstance(default, type) or callable(default):
        return field(default_factory=default, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrackingConfig:
    """Where metrics and artifacts go."""

    enabled: bool = _opt(True, "Send metrics, params and artifacts to MLflow (the run folder is written either way).")
    uri: str | None = _opt(
        None,
        "MLflow tracking URI. null: the trainer's MLFlowLogger, else $MLFLOW_TRACKING_URI, else "
        "sqlite:///<output_dir>/mlflow.db.",
    )
    experiment: str = _opt("anemoi-profiler", "Experiment of the run the profiler opens when there is no MLFlowLogger.")
    run_name: str | None = _opt(None, "Name of that run; null: the run folder's name.")
    flush_interval_s: float = _opt(
        5.0, "Seconds between sends to MLflow (from a child process); the training thread never waits for them."
    )
    retry_interval_s: float = _opt(30.0, "Seconds between retries while MLflow does not answer.")
    close_timeout_s: float = _opt(
        30.0, "Longest wait for MLflow at the end of the run; what is left stays in <run folder>/spool/."
    )
    upload_artifacts: bool = _opt(True, "Upload the run folder to the MLflow run under profiler/.")


@dataclass
class ThroughputConfig:
    """Samples, batches and items per second and MFU, measured without a device sync per step."""

    enabled: bool = _opt(True, "Log throughput/{train,val}/... and summary/... rates.")
    warmup_steps: int = _opt(5, "First training batches not measured (compilation, allocator and cache warmup).")
    length_fn: str | None = _opt(
        None, "'package.module:function' giving the items (tokens, grid points) in a batch, for items_per_sec."
    )
    batch_size_fn: str | None = _opt(
        None, "'package.module:function' giving the samples in a batch; null: dim 0 of the first tensor found."
    )
    flops_per_sample: float | None = _opt(
        None, "Forward+backward FLOPs of one sample; null: measured once on a real batch when the peak is known."
    )
    measure_flops: bool = _opt(True, "Measure FLOPs per sample with torch's FlopCounterMode on the first batch.")
    device_peak_flops: float | None = _opt(
        None,
        "Dense peak FLOP/s of one device; null: looked up for the precision (NVIDIA V100 to B200, AMD MI210, MI250X "
        "and MI250 per GCD, MI300X, MI300A; docs/metrics.md).",
    )


@dataclass
class TimingConfig:
    """Step time, dataloader wait and peak memory per log interval."""

    enabled: bool = _opt(True, "Log time/... and memory/... per log interval.")


@dataclass
class SystemConfig:
    """CPU, memory, disk, network, per-GPU metrics and energy from a background thread, under MLflow's names."""

    enabled: bool = _opt(True, "Sample system metrics (one sampler per node, on local rank 0).")
    interval_s: float = _opt(10.0, "Seconds between samples; one more is taken at the start and at the end.")
    gpus: bool = _opt(
        True,
        "Include this job's GPUs, with their energy: NVIDIA through NVML (the gpu extra: nvidia-ml-py), AMD through "
        "amdsmi (the package of your ROCm).",
    )
    disk_path: str = _opt("/", "Filesystem whose usage is reported.")


@dataclass
class WindowConfig:
    """A torch.profiler schedule: skip `skip_first` batches, then `repeat` cycles of wait, warmup, active."""

    skip_first: int = _opt(10, "Batches skipped before the first cycle.")
    wait: int = _opt(5, "Batches idle at the start of each cycle.")
    warmup: int = _opt(2, "Batches traced but discarded before the active ones.")
    active: int = _opt(3, "Batches recorded per window.")
    repeat: int = _opt(1, "Number of windows; 0 repeats until the stage ends.")


@dataclass
class TorchProfilerConfig:
    """Profiling windows with torch.profiler: traces, time report, memory report."""

    enabled: bool = _opt(False, "Run torch.profiler windows.")
    train: WindowConfig = _opt(WindowConfig, "Training schedule, counted in training batches.")
    validation: bool = _opt(True, "Also profile validation (never the sanity check).")
    val: WindowConfig = _opt(
        lambda: WindowConfig(skip_first=0, wait=0, warmup=1, active=2, repeat=1),
        "Validation schedule, counted in batches of each validation run.",
    )
    record_shapes: bool = _opt(True, "Record input shapes of operators.")
    profile_memory: bool = _opt(True, "Record allocations per operator (the memory report needs it).")
    with_stack: bool = _opt(False, "Record Python stacks (large traces).")
    with_flops: bool = _opt(False, "Estimate FLOPs of matmuls and convolutions.")
    with_modules: bool = _opt(False, "Record the nn.Module hierarchy of operators.")
    sync_events: bool = _opt(True, "Record CUDA synchronization events, which HTA's critical-path analysis needs.")
    traces: bool = _opt(True, "Write Chrome traces (traces/<stage>/window_<k>/rank<r>.pt.trace.json.gz).")
    trace_budget_mb: float = _opt(
        300.0, "Warn before a window whose uncompressed trace would exceed this; above 4x it is not written."
    )
    upload_traces_max_mb: float = _opt(
        200.0, "Upload traces to MLflow only while their total stays below this; the run folder keeps them all."
    )
    time_report: bool = _opt(True, "Write time_report.{csv,json}: top operators by CPU and device time.")
    memory_report: bool = _opt(True, "Write memory_report.{txt,csv,json}: allocations per operator, explained.")
    memory_timeline: bool = _opt(
        False, "Write memory/timeline_rank<r>.html with export_memory_timeline (CUDA only; slow on long windows)."
    )
    top_n: int = _opt(30, "Operators per table.")


@dataclass
class MemorySnapshotConfig:
    """CUDA caching-allocator snapshot (open at pytorch.org/memory_viz); also dumped when the run dies."""

    enabled: bool = _opt(False, "Record allocation history and dump memory/snapshot_rank<r>.pickle (CUDA only).")
    start_step: int = _opt(5, "Training batch at which recording starts.")
    steps: int = _opt(3, "Batches recorded.")
    max_entries: int = _opt(100000, "Allocation events kept in the history.")
    on_exception: bool = _opt(True, "Also dump a snapshot when the run dies (out of memory or any exception).")


@dataclass
class ModelSummaryConfig:
    """torchinfo summary of the model on a real batch (rank 0)."""

    enabled: bool = _opt(False, "Write model_summary.txt and model/... params.")
    depth: int = _opt(3, "Module nesting depth shown.")


@dataclass
class HtaConfig:
    """Holistic Trace Analysis over the run's traces after fit (rank 0; needs the hta extra)."""

    enabled: bool = _opt(False, "Analyse every trace window after fit; results in hta/ and hta/... metrics.")
    time_limit_s: float = _opt(300.0, "Seconds for all analyses together; what is left is skipped and said so.")
    memory_limit_mb: float = _opt(
        8000.0, "Resident memory of the HTA process (MB) above which it is stopped and the rest skipped, said so."
    )


@dataclass
class DistributedConfig:
    """Multi-process runs (DDP, FSDP; Lightning's launcher, torchrun, SLURM)."""

    profiled_ranks: Any = _opt("all", "Global ranks that run torch.profiler windows: 'all' or a list such as [0, 1].")
    timeout_s: float = _opt(
        120.0, "Timeout of the profiler's own collectives; a dead rank never freezes the others in profiler code."
    )
    data_parallel_size: Any = _opt(
        "auto",
        "Data-parallel replicas, whose samples global rates count once each: 'auto' (the strategy's sampler "
        "replicas, anemoi's model groups, else the world size) or an integer dividing the world size.",
    )
    item_counting: str = _opt(
        "replica",
        "How global items/s count length_fn's items: 'replica' (every rank of a replica holds the same items, "
        "as under tensor parallelism: once per replica) or 'rank' (each rank holds its own slice, as anemoi's "
        "sharded grids: summed over ranks).",
    )
    straggler: bool = _opt(
        True,
        "Time each rank's wait for the gradient all-reduce (a DDP communication hook doing the same all-reduce) "
        "to name the rank the others wait for.",
    )


@dataclass
class ReportConfig:
    """The end-of-run report: which renderings to make."""

    console: bool = _opt(True, "Print the report at the end of the run.")
    txt: bool = _opt(True, "Write report.txt.")
    json: bool = _opt(True, "Write report.json.")
    html: bool = _opt(True, "Write report.html (self-contained, plots inline) and plots/*.png.")


@dataclass
class ProfilerConfig:
    """Root of the configuration."""

    output_dir: str = _opt(
        "profiler_runs", "Run folders <YYYYmmdd-HHMMSS>_<config hash>/ go below it, and the embedded mlflow.db."
    )
    log_every_n_steps: int = _opt(
        50, "Training batches per log interval: rates, times and peaks are aggregated over it."
    )
    tracking: TrackingConfig = _opt(TrackingConfig, TrackingConfig.__doc__)
    throughput: ThroughputConfig = _opt(ThroughputConfig, ThroughputConfig.__doc__)
    timing: TimingConfig = _opt(TimingConfig, TimingConfig.__doc__)
    system: SystemConfig = _opt(SystemConfig, SystemConfig.__doc__)
    profiler: TorchProfilerConfig = _opt(TorchProfilerConfig, TorchProfilerConfig.__doc__)
    memory_snapshot: MemorySnapshotConfig = _opt(MemorySnapshotConfig, MemorySnapshotConfig.__doc__)
    model_summary: ModelSummaryConfig = _opt(ModelSummaryConfig, ModelSummaryConfig.__doc__)
    hta: HtaConfig = _opt(HtaConfig, HtaConfig.__doc__)
    distributed: DistributedConfig = _opt(DistributedConfig, DistributedConfig.__doc__)
    report: ReportConfig = _opt(ReportConfig, ReportConfig.__doc__)

    @classmethod
    def load(cls, source: ConfigSource | None = None, overrides: Iterable[str] = ()) -> ProfilerConfig:
        """Build a validated config from defaults, a preset name or YAML path (or a mapping), and overrides.

        A mapping may be a section of a Hydra/OmegaConf tree: its interpolations are resolved against the
        whole tree it belongs to. `overrides` are `key=value` strings such as `"throughput.warmup_steps=10"`.
        """
        layers: list[DictConfig] = [OmegaConf.structured(cls)]
        if source is not None:
            layers.append(_load_source(source))
        overrides = list(overrides)
        if overrides:
            layers.append(_parse_overrides(overrides))
        # A section of a larger tree: errors name the key as it is there (`diagnostics.profiler.log_every_n_steps`).
        where = f"{source._get_full_key(None)}." if isinstance(source, DictConfig) and source._get_parent() else ""
        try:
            config = OmegaConf.to_object(OmegaConf.merge(*layers))
            assert isinstance(config, cls)
            config.validate()
        except OmegaConfBaseException as error:
            raise ConfigError(where + _explain(error)) from None
        except ConfigError as error:
            raise ConfigError(where + str(error)) from None
        return config

    @classmethod
    def ensure(cls, config: ProfilerConfig | ConfigSource | None) -> ProfilerConfig:
        """`config` itself, validated, or what `load` makes of it: what a callback's `config` argument accepts.

        LightningCLI (jsonargparse) hands over a `ProfilerConfig` built from YAML without `validate`; Hydra's
        `instantiate` a `DictConfig`; a YAML file may name a preset or a path.
        """
        if isinstance(config, cls):
            config.validate()
            return config
        return cls.load(config)

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
        ranks = self.distributed.profiled_ranks
        ranks_ok = ranks == "all" or (
            isinstance(ranks, Iterable) and not isinstance(ranks, str) and all(_is_integer(r) and r >= 0 for r in ranks)
        )
        checks.append(("distributed.profiled_ranks", ranks_ok, "'all' or a list of global ranks >= 0"))
        checks.append(("hta.time_limit_s", self.hta.time_limit_s > 0, "a number of seconds > 0"))
        checks.append(("hta.memory_limit_mb", self.hta.memory_limit_mb > 0, "a number of MB > 0"))
        replicas = self.distributed.data_parallel_size
        replicas_ok = replicas == "auto" or (_is_integer(replicas) and replicas >= 1)
        checks.append(("distributed.data_parallel_size", replicas_ok, "'auto' or an integer >= 1"))
        counting_ok = self.distributed.item_counting in ITEM_COUNTING
        checks.append(("distributed.item_counting", counting_ok, " or ".join(repr(c) for c in ITEM_COUNTING)))
        checks.append(("distributed.timeout_s", self.distributed.timeout_s > 0, "a number of seconds > 0"))
        for key, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"{key}: got {_value_at(self, key)!r}, expected {allowed}")

    def is_profiled_rank(self, rank: int) -> bool:
        return self.distributed.profiled_ranks == "all" or rank in self.distributed.profiled_ranks

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.structured(self))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """8 hex digits identifying the resolved config, used in run folder names."""
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()[:8]


def reference(node: Any = None, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key, type, default, help) for every leaf key, for docs/configuration.md and `config --explain`."""
    node = ProfilerConfig() if node is None else node
    rows = []
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value):
            rows += reference(value, f"{prefix}{item.name}.")
        else:
            kind = str(item.type).replace(" | None", " or null")
            rows.append((f"{prefix}{item.name}", kind, value, item.metadata.get("help", "")))
    return rows


def preset_path(name: str) -> Path:
    return Path(str(resources.files("anemoi_profiler") / "presets" / f"{name}.yaml"))


def register_hydra_configs(group: str = "profiler", package: str = "diagnostics.profiler") -> None:
    """Store the schema and the presets in Hydra's ConfigStore, as options `schema`, `simple`, `detailed` of `group`.

    Each is a structured node typed by `ProfilerConfig` placed at `package` of the composed tree, so
    `python train.py profiler=detailed diagnostics.profiler.log_every_n_steps=10` works and a misspelt key
    or a wrong type fails when Hydra composes the tree, before training starts. Call it before `@hydra.main`
    runs (at import time of the training script).
    """
    from hydra.core.config_store import ConfigStore  # Hydra is the user's dependency, not ours

    store = ConfigStore.instance()
    store.store(group=group, name="schema", node=OmegaConf.structured(ProfilerConfig), package=package)
    for name in PRESETS:
        node = OmegaConf.merge(OmegaConf.structured(ProfilerConfig), _load_source(name))
        store.store(group=group, name=name, node=node, package=package)


def _load_source(source: ConfigSource) -> DictConfig:
    if OmegaConf.is_config(source):
        return _checked_sections(_resolved(source))
    if isinstance(source, Mapping):
        return _checked_sections(dict(source))
    path = preset_path(str(source)) if str(source) in PRESETS else Path(source)
    if not path.is_file():
        raise ConfigError(f"config {str(source)!r}: no such file, and not a preset (presets: {', '.join(PRESETS)})")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return _checked_sections(data)


def _resolved(section: Any) -> dict[str, Any]:
    """A plain dict of an OmegaConf node, its interpolations resolved against the root of the tree it is in.

    A child node keeps its parent, so `${paths.output}` in `cfg.diagnostics.profiler` resolves; an error names
    the key as it is in the user's tree (`diagnostics.profiler.output_dir`).
    """
    if not isinstance(section, DictConfig):
        raise ConfigError(f"expected a mapping of keys, got {type(section).__name__}")
    try:
        data = OmegaConf.to_container(section, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(_explain(error)) from None
    assert isinstance(data, dict)
    return data


def _checked_sections(data: dict[str, Any]) -> DictConfig:
    """A scalar where a section belongs (`throughput: 5`) would surface as OmegaConf's nameless merge error."""
    defaults = ProfilerConfig()
    for key, value in data.items():
        section = getattr(defaults, str(key), None)
        if dataclasses.is_dataclass(section) and not isinstance(value, (Mapping, type(None))):
            allowed = ", ".join(f.name for f in dataclasses.fields(section))
            raise ConfigError(f"{key}: got {value!r}, expected a section of keys: {allowed}")
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


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
