"""The single place that talks to MLflow, torch-free: URI policy, spool, the sink thread and the sender process.

```
training thread -> TrackingSink (sink.py: a queue and a thread) -> spool files (spool.py)
                -> SenderProcess (sender.py: a child process) -> MlflowTarget (mlflow_target.py) -> MLflow
```

`anemoi-profiler sync` replays a spool through `MlflowTarget` directly.
`report`, `compare` and `analyze` fetch a run that lives only in MLflow through `run_download`.
"""

from __future__ import annotations

import os

from .uris import artifact_location_for, default_tracking_uri, resolve_tracking_uri

__all__ = ["artifact_location_for", "default_tracking_uri", "prestart_tracking", "resolve_tracking_uri"]

LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
"""Where launchers put a process's rank on its node, before Lightning knows it: torchrun and Lightning's own
launcher, srun, Open MPI, MPICH. The first one set counts."""


def prestart_tracking(tracking_uri: str | None = None) -> None:
    """Start the profiler's MLflow client, a child process, now: first thing in a script, before torch,
    Lightning and the model, so that it imports MLflow beside them.

    That import takes the child one to three seconds of CPU. Started when the callbacks are made, as it is
    otherwise, it runs beside a short run's first steps and its end waits for it (docs/benchmarks.md); started
    here, the process's next run takes it ready. `tracking_uri` (default: `$MLFLOW_TRACKING_URI`, else the
    embedded sqlite store) only tells which store's code to import with MLflow: the run goes where the
    configuration or the logger says. Only the processes that may log to MLflow start one (each node's first,
    local rank 0); nothing starts when one is waiting already. It never raises, and imports neither torch nor
    MLflow here. A child no run takes ends with this process, or after ten idle minutes.
    """
    if _local_rank() != 0:
        return
    from .sender import prestart

    prestart(resolve_tracking_uri(tracking_uri, None, "."))  # only its scheme counts: no output_dir needed


def _local_rank() -> int:
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0
