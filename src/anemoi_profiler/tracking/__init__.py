"""The single place that talks to MLflow, torch-free: URI policy, spool, the sink thread and the sender process.

```
training thread -> TrackingSink (sink.py: a queue and a thread) -> spool files (spool.py)
    -> sender (sender.py: a child process that follows the spool) -> MlflowTarget (mlflow_target.py) -> MLflow
```

The sender reports back through the spool too (`sender.json`); `close` waits for it at most one deadline. It also
records the stall of a training process that holds the interpreter lock (`wedge_watch`).

`anemoi-profiler sync` replays a spool through `MlflowTarget` directly.
`report`, `compare` and `analyze` fetch a run that lives only in MLflow through `run_download`.
"""

from __future__ import annotations

from anemoi_profiler.tracking.uris import artifact_location_for, default_tracking_uri, resolve_tracking_uri

__all__ = ["artifact_location_for", "default_tracking_uri", "resolve_tracking_uri"]
