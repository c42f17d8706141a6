"""Post-mortems of runs that stall, run out of memory or are stopped (docs/postmortem.md).

`recorder` is the session's part (`PostmortemRecorder`); `watchdog` notices stalls, `oom` records out-of-memory
errors, `signals` SIGTERM and SIGUSR1, `stacks` reads where a thread is, `native_stacks` arms faulthandler's
timer for a process that holds the GIL. What the files say is read back by `run_files.postmortem_files` and
`reports.postmortem_verdicts`.
"""

from anemoi_profiler.postmortem.recorder import PostmortemRecorder

__all__ = ["PostmortemRecorder"]
