"""A run read back from its run folder (or from the `profiler/` artifacts of an MLflow run, which
`tracking/run_download.py` fetches into a folder laid out the same way).

The diagnosis, the HTML report, the plots and `compare` all work from this, so they give the same answers
at the end of a fit, from `anemoi-profiler report` a week later, and in tests. Every file is optional: an
older run, a failed run or a partial download gives fewer parts, never an exception; only a folder that
holds none of the run files is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.run_files.layout import (
    ENVIRONMENT_FILE,
    HTA_SUMMARY,
    MEMORY_REPORT,
    METRICS_FILE,
    MODEL_SUMMARY_FILE,
    REPORT_JSON,
    RUN_FILES,
    TIME_REPORT,
    WINDOW_SUMMARIES_DIR,
    WINDOW_SUMMARY,
    WINDOWS_FILE,
)
from anemoi_profiler.run_files.system_tables import NodeSample, read_node_means

SUMMARY_AS_HTA = {
    "idle_pct": "idle_pct",
    "idle_host_wait_pct": "idle_host_wait_share_pct",
    "overlap_pct": "comm_comp_overlap_pct",
}
"""Window-summary fields under the names of HTA's scalars they equal (docs/hta.md), for runs HTA did not analyse."""
_HTA_KEY = re.compile(r"^hta/(?:(?P<window>.+)/)?(?:rank(?P<rank>\d+)|all_ranks)/(?P<name>[^/]+)$")


class RunFolderError(Exception):
    """The folder is not a run folder; the message says why."""


@dataclass(frozen=True)
class HtaValue:
    """One HTA scalar: `window` is `<stage>/window_<k>` ('' for a plain trace folder), `rank` None for all."""

    window: str
    rank: int | None
    name: str
    value: float

    @property
    def stage(self) -> str:
        return self.window.split("/", 1)[0] if self.window else ""


@dataclass
class RunData:
    folder: Path
    header: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    time_report: dict[str, Any] = field(default_factory=dict)
    memory_report: dict[str, Any] = field(default_factory=dict)
    hta: dict[str, Any] = field(default_factory=dict)
    model_summary: str = ""

    # ---- metrics.json ----
    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of a metric, in logging order."""
        points = self.metrics.get(key) or {}
        return list(points.get("step", [])), [float(v) for v in points.get("value", [])]

    def wall_times(self, key: str) -> list[float]:
        return [float(t) for t in (self.metrics.get(key) or {}).get("time", [])]

    def last(self, key: str) -> float | None:
        values = self.series(key)[1]
        return values[-1] if values else None

    def summary(self, name: str) -> float | None:
        """The end-of-run value `summary/<name>` (e.g. `train/step_ms`)."""
        return self.last(names.summary(name))

    def steady(self, key: str) -> float | None:
        """A per-interval metric (`time/train/step_ms`) at the run's steady state: its end-of-run `summary/...`
        value, over the log intervals after warmup with slow stretches set apart (`reports.steady`)."""
        return self.last(names.summary_of(key))

    # ---- environment.json ----
    @property
    def on_gpu(self) -> bool:
        accelerator = self.environment.get("accelerator")
        if accelerator:
            return accelerator == "CUDAAccelerator"
        return bool(self.environment.get("devices")) or names.PEAK_ALLOCATED_MB in self.metrics

    def device_memory_mb(self) -> float | None:
        """Memory of rank 0's device (the first visible one), in MB."""
        devices = self.environment.get("devices") or []
        memory = devices[0].get("memory_mb") if devices else None
        return float(memory) if memory else None

    @property
    def title(self) -> str:
        return str(self.header.get("model") or self.folder.name)

    def describe(self) -> dict[str, Any]:
        """What the run was: model, hardware, parallelism, versions (report header, else environment.json)."""
        env = self.environment
        devices = env.get("devices") or []
        described = {
            "run folder": self.folder.name,
            "model": self.header.get("model"),
            "device": self.header.get("device") or (devices[0]["name"] if devices else "cpu"),
            "device memory": f"{devices[0]['memory_mb'] / 1000:.1f} GB" if devices else None,
            "world size": self.header.get("world size", env.get("world_size")),
            "nodes": env.get("num_nodes"),
            "precision": self.header.get("precision", env.get("precision")),
            "strategy": self.header.get("strategy", env.get("strategy")),
            "status": self.header.get("status"),
            "duration": self.header.get("duration"),
            "steps": self.header.get("steps"),
            "host": env.get("hostname"),
            "python": env.get("python"),
            "cuda": env.get("cuda"),
            "versions": self.header.get("versions")
            or ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items() if v),
            "git commit": env.get("git_commit"),
        }
        return {key: value for key, value in described.items() if value not in (None, "")}

    # ---- system_metrics/nodes.csv, gpus.csv ----
    def system_node_means(self) -> list[NodeSample]:
        """Each node's and GPU's system figures, averaged over the run (read from the tables when asked: they
        grow with the nodes and the run's length)."""
        return read_node_means(self.folder)

    # ---- windows.json ----
    def profiling_windows(self) -> list[dict[str, Any]]:
        """Every profiling window with its reason (`run.window_triggers.window_entries`): windows.json, which rank 0
        writes as each triggered window opens, so the report drawn before the run's last section has them."""
        return _read_json(self.folder / WINDOWS_FILE).get("windows") or []

    # ---- time_report.json / memory_report.json ----
    def operator_windows(self, stage: str, report: str = "time") -> list[dict[str, Any]]:
        """The windows of a stage in time_report.json (or memory_report.json): steps, device flag, operators."""
        document = self.time_report if report == "time" else self.memory_report
        return [w for w in document.get("windows") or [] if w.get("stage") == stage]

    def device_busy_ms_per_step(self, stage: str = "train") -> float | None:
        """Kernel time per profiled step, a lower bound (the time report holds the top operators only).

        The report lists a kernel twice: as a row of its own (no CPU time) and within the self device time
        of the operator that launched it; each sum alone is a partial view, so the larger one is taken.
        """
        windows = [w for w in self.operator_windows(stage) if w.get("device")]
        steps = sum(int(w.get("steps") or 0) for w in windows)
        if not steps:
            return None
        operators = [op for w in windows for op in w.get("operators") or []]
        kernels = sum(float(op.get("self_device_ms") or 0.0) for op in operators if not op.get("self_cpu_ms"))
        launchers = sum(float(op.get("self_device_ms") or 0.0) for op in operators if op.get("self_cpu_ms"))
        return max(kernels, launchers) / steps

    def profiled_memory(self) -> dict[str, float]:
        """Totals over the profiled steps (peaks, allocation retries, OOMs); {} without CUDA profiling."""
        profiled = self.memory_report.get("profiled_steps") or {}
        return {key: float(value) for key, value in (profiled.get("totals") or {}).items()}

    # ---- hta/summary.json ----
    def hta_values(self, stage: str = "train") -> list[HtaValue]:
        """HTA's scalars of a stage's windows; of every window when HTA analysed none of that stage."""
        parsed = []
        for key, value in (self.hta.get("metrics") or {}).items():
            match = _HTA_KEY.match(key)
            if match and isinstance(value, (int, float)):
                rank = int(match["rank"]) if match["rank"] is not None else None
                parsed.append(HtaValue(match["window"] or "", rank, match["name"], float(value)))
        of_stage = [v for v in parsed if v.stage == stage]
        return of_stage or parsed

    # ---- window_summaries/<stage>/window_<k>/window_summary.json ----
    def window_summary_values(self, stage: str = "train") -> list[HtaValue]:
        """The window summaries' figures as HTA's scalars (`SUMMARY_AS_HTA`); communication's share of kernel
        time as HTA's kernel type breakdown gives it: communication running alone, over all ranks' kernel time."""
        values = []
        for path in sorted((self.folder / WINDOW_SUMMARIES_DIR).glob(f"*/window_*/{WINDOW_SUMMARY}.json")):
            window, rows = f"{path.parent.parent.name}/{path.parent.name}", _read_json(path).get("ranks") or []
            for row in rows:
                for ours, theirs in SUMMARY_AS_HTA.items():
                    if isinstance(row.get(ours), int | float):
                        values.append(HtaValue(window, int(row["rank"]), theirs, float(row[ours])))
            weighted = [(r["communication_only_pct"], r["kernel_ms"]) for r in rows if r.get("kernel_ms")]
            if weighted:
                share = sum(pct * ms for pct, ms in weighted) / sum(ms for _, ms in weighted)
                values.append(HtaValue(window, None, "communication_kernel_time_pct", share))
        of_stage = [v for v in values if v.stage == stage]
        return of_stage or values

    def analysis_values(self, stage: str = "train") -> tuple[str, list[HtaValue]]:
        """(source, values): HTA's scalars where HTA analysed the run, else the window summary's."""
        hta = self.hta_values(stage)
        return ("HTA", hta) if hta else ("the window summary", self.window_summary_values(stage))

    # ---- report.json ----
    def operator_sections(self) -> list[tuple[str, dict[str, Any]]]:
        """The report's operator tables (by time and by memory) in report order."""
        return [(title, s) for title, s in self.sections.items() if "operators" in (s.get("data") or {})]


def load_run(folder: Path, report: Mapping[str, Any] | None = None) -> RunData:
    """Read a run folder; raise RunFolderError when it holds none of `RUN_FILES`.

    `report` is the report's document (`RunReport.to_json()`) where the caller holds it before report.json is
    written (the end of a fit, which diagnoses the run to open the report): it is read as report.json would be.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"no such folder: {folder}")
    if not any((folder / name).is_file() for name in RUN_FILES):
        raise RunFolderError(f"{folder} is not a run folder: none of {', '.join(RUN_FILES)} in it")
    report = _read_json(folder / REPORT_JSON) if report is None else json.loads(json.dumps(report, default=str))
    return RunData(
        folder=folder,
        header=report.get("header") or {},
        sections=report.get("sections") or {},
        metrics=read_history(folder),
        environment=_read_json(folder / ENVIRONMENT_FILE),
        time_report=_read_json(folder / f"{TIME_REPORT}.json"),
        memory_report=_read_json(folder / f"{MEMORY_REPORT}.json"),
        hta=_read_json(folder / HTA_SUMMARY),
        model_summary=_read_text(folder / MODEL_SUMMARY_FILE),
    )


def read_history(folder: Path) -> dict[str, dict[str, list[Any]]]:
    """The metrics.json of a run folder: {key: {"step": [...], "value": [...], "time": [...]}}; {} without one."""
    return _read_json(Path(folder) / METRICS_FILE)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object, or {} when the file is missing or unreadable (a run cut short can leave half a file)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
