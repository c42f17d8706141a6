"""The run folder, the contract every part of the profiler writes to and reads from: each name in one place.

```
<output_dir>/<YYYYmmdd-HHMMSS>_<8-hex config hash>/     a run folder (`create_run_folder`)
  config.yaml  environment.json  metrics.json  steps.json  windows.json  window_request.json
  report.txt  report.json  report.html  plots/<name>.svg
  system_metrics/nodes.csv  system_metrics/gpus.csv     (every node's and GPU's system samples)
  model_summary.txt  time_report.{csv,json}  memory_report.{txt,csv,json}
  traces/<stage>/window_<k>/rank<r>.pt.trace.json.gz
  window_summaries/<stage>/window_<k>/window_summary.{csv,json}  .../kernel_names_rank<r>.json
  memory/snapshot_rank<r>.pickle  memory/snapshot_rank<r>_exception.pickle  memory/timeline_rank<r>.html
  memory/snapshot_rank<r>_window<k>.pickle     (a triggered or requested window's snapshot)
  hta/summary.json  hta/<stage>/window_<k>/...
  spool/rank<r>/run.json  spool/rank<r>/batch-*.json     (only while metrics wait for MLflow)
  postmortem/stall_<k>.json  postmortem/stall_<k>/rank<r>.json     (a stall: all ranks, and each rank's part)
  postmortem/oom_rank<r>.json  postmortem/oom_rank<r>.pickle  postmortem/signal_rank<r>.json
  postmortem/flight_recorder/rank_<r>  postmortem/stall_<k>/flight_recorder/rank_<r>     (Flight Recorder dumps)
  postmortem/faulthandler_rank<r>.txt     (only while training: faulthandler's armed dump, see below)
  postmortem/stall_<k>/rank<r>_faulthandler.txt     (that dump, once it was written: a wedged process's stacks)
```

The MLflow run holds the same files under `ARTIFACT_ROOT/`, except the spool. Torch-free: the command line
and the tracking sender read it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

ARTIFACT_ROOT = "profiler"
"""Where the run folder is uploaded in the MLflow run."""

CONFIG_FILE = "config.yaml"
ENVIRONMENT_FILE = "environment.json"
METRICS_FILE = "metrics.json"
STEPS_FILE = "steps.json"
"""Each measured step's duration and why it is not steady state (`run_files/steps_file.py`)."""
REPORT_TXT = "report.txt"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"
MODEL_SUMMARY_FILE = "model_summary.txt"
TIME_REPORT = "time_report"
"""Stem of `time_report.csv` and `time_report.json`."""
MEMORY_REPORT = "memory_report"
"""Stem of `memory_report.txt`, `.csv` and `.json`."""
TRACES_DIR = "traces"
TRACE_SUFFIX = ".pt.trace.json.gz"
HELD_SUFFIX = ".held"
"""Added to a trace's name while `profiler.traces: flagged` has not yet decided whether the rank keeps it."""
WINDOW_SUMMARIES_DIR = "window_summaries"
"""Beside `traces/`, not inside: HTA reads every `.json` of a trace folder as a trace."""
WINDOW_SUMMARY = "window_summary"
"""Stem of `window_summary.csv` and `.json`: every rank's summary of one window."""
MEMORY_DIR = "memory"
HTA_DIR = "hta"
HTA_SUMMARY_FILE = "summary.json"
WINDOWS_FILE = "windows.json"
REQUEST_FILE = "window_request.json"
"""A profiling window asked for by `anemoi-profiler request`, answered with the step it was served at."""
"""Every profiling window of the run, scheduled, triggered or requested, with its reason and evidence."""
SYSTEM_METRICS_DIR = "system_metrics"
"""Every node's system samples: MLflow gets the cluster's view, this folder the detail (`system_tables`)."""
SYSTEM_NODES_FILE = "nodes.csv"
SYSTEM_GPUS_FILE = "gpus.csv"
POSTMORTEM_DIR = "postmortem"
"""What happened to a run that stalled, ran out of memory or was stopped (docs/postmortem.md)."""
SPOOL_DIR = "spool"
RUN_INFO_FILE = "run.json"
"""In each spool folder: the tracking URI (redacted), experiment, run id and run name the spool belongs to."""
NOT_UPLOADED = (SPOOL_DIR,)
"""Top-level folders of a run folder that stay out of the MLflow upload."""
HTA_SUMMARY = f"{HTA_DIR}/{HTA_SUMMARY_FILE}"
RUN_FILES = (REPORT_JSON, METRICS_FILE, ENVIRONMENT_FILE)
"""A folder with none of these is not a run folder."""
REPORT_INPUTS = (
    *RUN_FILES,
    CONFIG_FILE,
    STEPS_FILE,
    WINDOWS_FILE,
    f"{TIME_REPORT}.json",
    f"{MEMORY_REPORT}.json",
    MODEL_SUMMARY_FILE,
    HTA_SUMMARY,
    f"{SYSTEM_METRICS_DIR}/{SYSTEM_NODES_FILE}",
    f"{SYSTEM_METRICS_DIR}/{SYSTEM_GPUS_FILE}",
)
"""What reports and comparisons read: all an MLflow run's download needs (its traces only for `analyze`)."""

_RUN_FOLDER_NAME = re.compile(r"^\d{8}-\d{6}_[0-9a-f]{8}(-\d+)?$")


def has_run_folder_name(path: Path) -> bool:
    """Whether `path` is named as `create_run_folder` names run folders."""
    return bool(_RUN_FOLDER_NAME.match(path.name))


def trace_path(run_dir: Path, stage: str, window: int, rank: int) -> Path:
    return window_dir(run_dir, stage, window) / f"rank{rank}{TRACE_SUFFIX}"


def window_dir(run_dir: Path, stage: str, window: int) -> Path:
    return run_dir / TRACES_DIR / stage / f"window_{window}"


def window_summary_path(run_dir: Path, stage: str, window: int, suffix: str) -> Path:
    """`window_summaries/<stage>/window_<k>/window_summary<suffix>` (`.csv` or `.json`)."""
    return run_dir / WINDOW_SUMMARIES_DIR / stage / f"window_{window}" / f"{WINDOW_SUMMARY}{suffix}"


def kernel_names_path(run_dir: Path, stage: str, window: int, rank: int) -> Path:
    """The kernel names behind the hashes rank `rank` exchanged for a window."""
    return run_dir / WINDOW_SUMMARIES_DIR / stage / f"window_{window}" / f"kernel_names_rank{rank}.json"


def snapshot_path(run_dir: Path, rank: int, at_exception: bool = False) -> Path:
    return run_dir / MEMORY_DIR / f"snapshot_rank{rank}{'_exception' if at_exception else ''}.pickle"


def window_snapshot_path(run_dir: Path, rank: int, window: int) -> Path:
    """The snapshot of a triggered or requested training window: beside, never over, the scheduled one."""
    return run_dir / MEMORY_DIR / f"snapshot_rank{rank}_window{window}.pickle"


def timeline_path(run_dir: Path, rank: int) -> Path:
    return run_dir / MEMORY_DIR / f"timeline_rank{rank}.html"


def stall_path(run_dir: Path, episode: int) -> Path:
    """Every rank's part of stall `episode` side by side, with the rank that holds the others."""
    return run_dir / POSTMORTEM_DIR / f"stall_{episode}.json"


def stall_part_path(run_dir: Path, episode: int, rank: int) -> Path:
    """One rank's part of a stall: where its training thread is, every thread's stack."""
    return run_dir / POSTMORTEM_DIR / f"stall_{episode}" / f"rank{rank}.json"


def oom_path(run_dir: Path, rank: int, suffix: str = ".json") -> Path:
    """A rank's out-of-memory record (`.json`) and its CUDA memory snapshot (`.pickle`, for memory_viz)."""
    return run_dir / POSTMORTEM_DIR / f"oom_rank{rank}{suffix}"


def signal_path(run_dir: Path, rank: int) -> Path:
    return run_dir / POSTMORTEM_DIR / f"signal_rank{rank}.json"


def faulthandler_path(run_dir: Path, rank: int) -> Path:
    """Where faulthandler's C timer writes every thread's stack when a rank's process cannot run Python (the
    interpreter lock held); the MLflow sender watches for it (`faulthandler_paths`)."""
    return run_dir / POSTMORTEM_DIR / f"faulthandler_rank{rank}.txt"


def faulthandler_paths(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / POSTMORTEM_DIR).glob("faulthandler_rank*.txt"))


def wedged_dump_path(run_dir: Path, episode: int, rank: int) -> Path:
    """A dump that was written, kept beside the rank's part of the stall it belongs to."""
    return run_dir / POSTMORTEM_DIR / f"stall_{episode}" / f"rank{rank}_faulthandler.txt"


def flight_recorder_prefix(run_dir: Path) -> Path:
    """NCCL's Flight Recorder dumps on a timeout to `<prefix><rank>` (TORCH_FR_DUMP_TEMP_FILE), as `torchfrtrace`
    reads them."""
    return run_dir / POSTMORTEM_DIR / "flight_recorder" / "rank_"


def spool_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / SPOOL_DIR / f"rank{rank}"


def spool_dirs(run_dir: Path) -> list[Path]:
    """Every rank's spool folder of a run folder (those with a run file)."""
    return sorted(path.parent for path in (Path(run_dir) / SPOOL_DIR).glob(f"*/{RUN_INFO_FILE}"))


def create_run_folder(output_dir: Path, fingerprint: str) -> Path:
    """`<output_dir>/<YYYYmmdd-HHMMSS>_<hash>/`; a second job in the same second gets a `-1` suffix."""
    base = f"{time.strftime('%Y%m%d-%H%M%S')}_{fingerprint}"
    for attempt in range(1000):
        path = output_dir / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new run folder below {output_dir}")


def run_folders(output_dir: Path) -> list[Path]:
    """The run folders below `output_dir`, oldest first: by the time in their names, then, for runs started
    in the same second (a `validate()` right after a short fit), by when their config copy was written."""
    folders = [p for p in Path(output_dir).iterdir() if p.is_dir() and has_run_folder_name(p)]
    return sorted(folders, key=lambda folder: (folder.name[:15], _written_ns(folder / CONFIG_FILE), folder.name))


def _written_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
