"""The tracking sink of one rank, spooling below its run folder: the session's and component profiling's."""

from __future__ import annotations

from pathlib import Path

from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.layout import spool_dir
from anemoi_profiler.tracking.sink import TrackingSink

log = get_logger(__name__)


def open_sink(
    config: ProfilerConfig,
    run_dir: Path,
    rank: int,
    tracking_uri: str,
    *,
    run_name: str,
    run_id: str | None = None,
    key_prefix: str = "",
) -> TrackingSink | None:
    """The sink of this rank, spooling below the run folder; None (with a warning) when the spool cannot be
    written: then nothing goes to MLflow, and the training goes on."""
    tracking = config.tracking
    try:
        return TrackingSink(
            tracking_uri,
            tracking.experiment,
            spool_dir(run_dir, rank),
            run_id=run_id,
            run_name=run_name,
            key_prefix=key_prefix,
            flush_interval_s=tracking.flush_interval_s,
            retry_interval_s=tracking.retry_interval_s,
            close_timeout_s=tracking.close_timeout_s,
            relay_requests=rank == 0 and config.triggers.enabled and config.triggers.requests,
        )
    except OSError as error:
        log.warning(
            "cannot write the MLflow spool in %s (%s: %s); nothing is sent to MLflow for this run, training goes on",
            spool_dir(run_dir, rank).parent,
            type(error).__name__,
            error.strerror or error,
        )
        return None
