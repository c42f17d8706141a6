"""The package's loggers: every message starts with `PREFIX`, written here once.

The profiler speaks inside someone else's training log, through the handlers of Lightning or the user: the
prefix tells its lines apart. So every module logs through `get_logger`, and no message types the prefix.
Lines that are printed rather than logged, because they must show whatever the logging setup (a command's answers
and errors, where a run went), start with `PREFIX` too. `warning_once` says a recurring problem once per owner
(a sink, a thread, a stage).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, MutableSet
from typing import Any

PREFIX = "anemoi-profiler: "


class ProfilerLogger(logging.LoggerAdapter):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"{PREFIX}{msg}", kwargs

    def warning_once(self, said: MutableSet[Hashable], key: Hashable, msg: str, *args: Any) -> None:
        """Log a warning unless `key` is in `said` (the owner's record of what it said), and note it there."""
        if key not in said:
            said.add(key)
            self.warning(msg, *args, stacklevel=2)


def get_logger(name: str) -> ProfilerLogger:
    return ProfilerLogger(logging.getLogger(name), {})
