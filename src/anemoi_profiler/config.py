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
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from anemoi_profiler.config_sections import (
    ITEM_COUNTING,
    DistributedConfig,
    HtaConfig,
    MemorySnapshotConfig,
    ModelSummaryConfig,
    PostmortemConfig,
    ReportConfig,
    SystemConfig,
    ThroughputConfig,
    TimingConfig,
    TorchProfilerConfig,
    TrackingConfig,
    TriggersConfig,
    _opt,
)

PRESETS = ("simple", "detailed")

ConfigSource = str | Path | Mapping[str, Any]
"""What `ProfilerConfig.load` reads: a preset name, a YAML path, or a mapping (an OmegaConf `DictConfig` too)."""


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""


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
    triggers: TriggersConfig = _opt(TriggersConfig, TriggersConfig.__doc__)
    postmortem: PostmortemConfig = _opt(PostmortemConfig, PostmortemConfig.__doc__)

    @classmethod
    def load(cls, source: ConfigSource | None = None, overrides: Iterable[str] = ()) -> ProfilerConfig:
        """Build a validated config from defaults, a preset name or YAML path (or a mapping), and overrides.

        A mapping may be a section of a Hydra/OmegaConf tree: its interpolations are resolved against the
        whole tree it belongs to.

        Args:
            source: A preset name (`simple`, `detailed`), a YAML file, a mapping or an OmegaConf node; None:
                the defaults alone.
            overrides: `key=value` strings applied last, such as `"throughput.warmup_steps=10"`.

        Returns:
            The validated config.

        Raises:
            ConfigError: A missing file, invalid YAML, an unknown key, a wrong type or an invalid value; the
                message names the key as the user wrote it.
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
        if isinstance(config, ProfilerConfig):
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
            ("profiler.traces", self.profiler.traces in (True, False, "flagged"), "true, false or 'flagged'"),
            ("profiler.flag_distance_pct", self.profiler.flag_distance_pct > 0, "a number of points > 0"),
            (
                "profiler.window_summary",
                self.profiler.window_summary or self.profiler.traces != "flagged",
                "true with profiler.traces: flagged (the summaries decide which ranks keep traces)",
            ),
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
        ranks_ok = ranks in ("auto", "all") or (
            isinstance(ranks, Iterable) and not isinstance(ranks, str) and all(_is_integer(r) and r >= 0 for r in ranks)
        )
        checks.append(("distributed.profiled_ranks", ranks_ok, "'auto', 'all' or a list of global ranks >= 0"))
        checks.append(("hta.time_limit_s", self.hta.time_limit_s > 0, "a number of seconds > 0"))
        checks.append(("hta.memory_limit_mb", self.hta.memory_limit_mb > 0, "a number of MB > 0"))
        replicas = self.distributed.data_parallel_size
        replicas_ok = replicas == "auto" or (_is_integer(replicas) and replicas >= 1)
        checks.append(("distributed.data_parallel_size", replicas_ok, "'auto' or an integer >= 1"))
        counting_ok = self.distributed.item_counting in ITEM_COUNTING
        checks.append(("distributed.item_counting", counting_ok, " or ".join(repr(c) for c in ITEM_COUNTING)))
        checks.append(("distributed.timeout_s", self.distributed.timeout_s > 0, "a number of seconds > 0"))
        stall_after_s = self.postmortem.stall_after_s
        stall_ok = stall_after_s == "auto" or (_is_number(stall_after_s) and stall_after_s > 0)
        checks.append(("postmortem.stall_after_s", stall_ok, "'auto' or a number of seconds > 0"))
        entries_ok = self.postmortem.memory_history_entries > 0
        checks.append(("postmortem.memory_history_entries", entries_ok, "an integer > 0"))
        checks += _trigger_checks(self.triggers)
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


def _trigger_checks(triggers: TriggersConfig) -> list[tuple[str, bool, str]]:
    integers = {"warmup_intervals": 0, "baseline_intervals": 5, "confirm_intervals": 1, "memory_intervals": 1}
    integers |= {"steps": 1, "profiler_warmup": 0, "cooldown_steps": 0, "max_windows": 0}
    checks = [
        (f"triggers.{name}", getattr(triggers, name) >= low, f"an integer >= {low}") for name, low in integers.items()
    ]
    for name in ("sigmas", "min_slowdown", "min_lag", "min_memory_growth", "request_poll_s"):
        checks.append((f"triggers.{name}", getattr(triggers, name) > 0, "a number > 0"))
    return checks


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

    Args:
        group: The config group the options go in (`profiler=detailed` on the command line).
        package: Where the chosen option lands in the composed tree.
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
    return cast(dict[str, Any], data)  # a key that is no string is named when the tree is merged


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
        factory = hints[part].default_factory
        node = factory() if factory is not dataclasses.MISSING else None
    return annotation.replace("None", "null")


def _value_at(config: ProfilerConfig, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
