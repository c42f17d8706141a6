"""The spool: a rank's records on disk until MLflow has them, one folder per rank of the run folder.

`run.json` names the run the records belong to; each `batch-<time>-<seq>.json` holds one `Batch`. Files
appear under their final name only when complete, so a reader never sees half a batch. The format is read
back by `anemoi-profiler sync`, possibly by a later version: keep it stable.

The spool is also how the sender process and the training process speak: the training process writes batches,
the sender sends and deletes them and writes `sender.json` (the run id, whether MLflow answers, its warnings);
MLflow's own output goes to `sender.log`. Both are dropped with the spool once nothing is left to send.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.layout import RUN_INFO_FILE
from anemoi_profiler.tracking.records import Batch

log = get_logger(__name__)


STATUS_FILE = "sender.json"
"""Written by the sender process: state (starting, up, away), reason, run_id, experiment_id, warnings,
warning_count, lost_metrics."""
LOG_FILE = "sender.log"
"""The sender process's stdout and stderr: MLflow's own prints never reach the user's terminal."""


class Target(Protocol):
    """Where a spool is sent: `MlflowTarget`."""

    def send(self, batch: Batch) -> None: ...


def read_run_info(spool_dir: Path) -> dict[str, Any]:
    return json.loads((spool_dir / RUN_INFO_FILE).read_text())


def write_run_info(spool_dir: Path, info: Mapping[str, Any], name: str = RUN_INFO_FILE) -> None:
    tmp = spool_dir / (name + ".tmp")
    tmp.write_text(json.dumps(dict(info), indent=2))
    tmp.replace(spool_dir / name)


def read_status(spool_dir: Path) -> dict[str, Any]:
    """What the sender process last wrote of itself; {} before it wrote anything (or if the disk lost it)."""
    try:
        return dict(json.loads((spool_dir / STATUS_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def read_batch(path: Path) -> Batch:
    return Batch.from_dict(json.loads(path.read_text()))


def write_batch(batch: Batch, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(batch.to_dict()))
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise
    tmp.replace(path)


def pending_batches(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.glob("batch-*.json"))


def replay_spool(spool_dir: Path, target: Target) -> tuple[int, int]:
    """Send every spooled batch, merged into as few requests as possible; return (files sent, files left).

    On failure the unsent remainder is written back in place of the first file, so order is kept and
    nothing is sent twice. An unreadable file is renamed `*.unreadable`, kept and counted as left. Used by the
    sender process and by `anemoi-profiler sync`.
    """
    files = pending_batches(spool_dir)
    if not files:
        return 0, 0
    merged, unreadable = Batch(), 0
    for path in list(files):
        try:
            merged.merge(read_batch(path))
        except (ValueError, TypeError) as error:  # spool files are written atomically: only a damaged disk
            kept = path.with_name(path.name + ".unreadable")
            path.replace(kept)
            files.remove(path)
            unreadable += 1
            log.warning("spool file %s is unreadable (%s); kept as %s, not sent", path, error, kept)
    if not files:
        return 0, unreadable
    try:
        target.send(merged)
    except Exception as error:
        try:
            write_batch(merged, files[0])
        except OSError:
            raise error from None  # a full disk: the files stay as they were; the store drops what it had already
        for path in files[1:]:
            path.unlink()
        raise
    for path in files:
        path.unlink()
    return len(files), unreadable


def remove_if_empty(spool_dir: Path) -> None:
    """Drop a spool left with nothing to send (its run file and the sender's alone), and `spool/` once no rank's
    is left."""
    own = (RUN_INFO_FILE, STATUS_FILE, STATUS_FILE + ".tmp", LOG_FILE)
    if not spool_dir.is_dir() or any(path.name not in own for path in spool_dir.iterdir()):
        return
    with contextlib.suppress(OSError):  # a read-only spool stays; nothing in it needs sending
        for name in own:
            (spool_dir / name).unlink(missing_ok=True)
        spool_dir.rmdir()
        spool_dir.parent.rmdir()  # refused while another rank's spool is still there


def count_metrics(files: list[Path]) -> int:
    """The metric points in these batch files; an unreadable file counts none."""
    count = 0
    for path in files:
        with contextlib.suppress(OSError, ValueError, TypeError):
            count += len(read_batch(path).metrics)
    return count
