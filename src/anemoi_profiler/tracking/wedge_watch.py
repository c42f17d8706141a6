"""The MLflow sender's watch for a wedged rank: a stall that no thread of the training process can record.

A training step wedged in C code that keeps the interpreter lock stops every Python thread of its process, the
stall watchdog and the tracking sink's thread included. faulthandler's C timer still writes the stacks
(`postmortem.native_stacks`); the sender, a process of its own beside rank 0, follows those files in the run
folder, writes the stall's record from a dump (`run_files.faulthandler_dump.record_wedged`) and tells the run at
once: the tag `profiler.postmortem` and a line of the description, as the recorder does for a stall it sees
itself. Torch-free, like the rest of the sender.
"""

from __future__ import annotations

import time
from pathlib import Path

from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.faulthandler_dump import record_wedged
from anemoi_profiler.run_files.layout import faulthandler_paths
from anemoi_profiler.run_files.postmortem_files import STALL, TAG, stall_told, told
from anemoi_profiler.tracking.mlflow_target import MlflowTarget
from anemoi_profiler.tracking.records import Batch

log = get_logger(__name__)

POLL_S = 1.0
"""How often the sender looks for a dump: the verdict comes within the timer's delay and this."""


class WedgeWatch:
    def __init__(self, spool_dir: Path) -> None:
        self.run_dir = spool_dir.parent.parent  # <run folder>/spool/rank<r>
        self._untold: list[str] = []
        """Stalls recorded and not yet told to MLflow (it may be away): told at a later poll."""
        self._next = 0.0

    def poll(self, target: MlflowTarget) -> None:
        """Record any dump written since the last poll and tell the run; never raises."""
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + POLL_S
        try:
            for dump in faulthandler_paths(self.run_dir):
                merged = record_wedged(self.run_dir, dump)
                if merged is not None:
                    log.info("a wedged process: %s", merged["summary"])
                    self._untold.append(stall_told(merged))
            if self._untold:
                self._tell(target)
        except Exception as error:  # MLflow away, a disk that refuses: the next poll tries again
            log.info("could not record or tell a wedged process: %s: %s", type(error).__name__, error)

    def _tell(self, target: MlflowTarget) -> None:
        run_id = target.ensure_run()
        told_kinds = target.client().get_run(run_id).data.tags.get(TAG, "")
        kinds = [kind for kind in told_kinds.split(",") if kind]
        batch = Batch(tags={TAG: ",".join([*kinds, STALL] if STALL not in kinds else kinds)})
        batch.description = told(self._untold[-1])
        target.send(batch)
        self._untold = []
