"""The shared lifecycle of every anemoi-profiler callback: join a session in `setup`, leave it at the end.

Subclasses implement `on_session_start` and `summarize`. Everything they do is guarded: an error inside a
profiler hook is logged once and that callback stops measuring, but training goes on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from anemoi_profiler.config import ConfigSource, ProfilerConfig
from anemoi_profiler.logs import get_logger
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.run.session import ProfilerSession
from anemoi_profiler.trainer.callback_base import Callback

log = get_logger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def guarded(hook: F) -> F:
    """Run a hook so that its failure disables this callback instead of killing the training."""

    @functools.wraps(hook)
    def wrapper(self: ProfilerCallback, *args: Any, **kwargs: Any) -> Any:
        if self.disabled:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as error:
            self.disabled = True
            log_failure(self, hook.__name__, error)
            return None

    return wrapper  # type: ignore[return-value]


def log_failure(callback: Any, hook: str, error: Exception) -> None:
    log.warning(
        "%s stopped measuring after an error in %s: %s: %s (training continues)",
        type(callback).__name__,
        hook,
        type(error).__name__,
        error,
    )


class ProfilerCallback(Callback):
    """Base of all anemoi-profiler callbacks. Pass a shared `session` (see `build_callbacks`) or a `config`.

    `config` may also be what `ProfilerConfig.load` reads (a preset name, a YAML path, a mapping or a Hydra
    `DictConfig`), so LightningCLI's `init_args` and Hydra's `instantiate` can build a callback from YAML.
    Callbacks given a config rather than a session, on one trainer and with equal configs, share the
    session of the first of them: one run folder, one MLflow run and one report, as `build_callbacks` gives.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
    """

    def __init__(
        self, config: ProfilerConfig | ConfigSource | None = None, session: ProfilerSession | None = None
    ) -> None:
        self.session = session or ProfilerSession(ProfilerConfig.ensure(config))
        self.config = self.session.config
        self._may_share = session is None
        self.disabled = False

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._may_share:
            self._share_session(trainer)
        # A profiler that cannot start (unwritable output folder) stays off; the session said why, once.
        self.disabled = not self.session.attach(trainer, self)
        if not self.disabled:
            self._start(trainer, pl_module)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._end(trainer, "FINISHED")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Ctrl-C, and a scheduler's SIGTERM (Lightning raises SIGTERMException, a SystemExit): stopped, not failed.
        stopped = isinstance(exception, (KeyboardInterrupt, SystemExit))
        try:
            self.session.postmortem.exception(trainer, exception)  # an out-of-memory error: its record
        except Exception as error:
            log.warning("could not record the error: %s: %s", type(error).__name__, error)
        self._end(trainer, "KILLED" if stopped else "FAILED")

    def _share_session(self, trainer: Any) -> None:
        """Join the session of an earlier profiler callback on this trainer with the same config.

        Lightning calls `setup` in the order of `trainer.callbacks`, so the first such callback has started
        its session by now and this one attaches to it. With another config the sessions stay apart, and
        the run gets two run folders: said in a warning, since that is rarely what was meant.
        """
        earlier = []
        for other in getattr(trainer, "callbacks", None) or []:
            if other is self:
                break
            if isinstance(other, ProfilerCallback) and other.session is not self.session:
                earlier.append(other)
        for other in earlier:
            if other.config.fingerprint() == self.config.fingerprint():
                self.session, self.config = other.session, other.session.config
                return
        if earlier:
            log.warning(
                "%s has another config than %s, so each writes its own run folder and MLflow run; "
                "give them the same config (or use build_callbacks) to share one",
                type(self).__name__,
                type(earlier[0]).__name__,
            )

    @guarded
    def _start(self, trainer: Any, pl_module: Any) -> None:
        self.on_session_start(trainer, pl_module)

    def _end(self, trainer: Any, status: str) -> None:
        if not self.session.is_member(self):
            return  # the run ended before `setup` (nothing was started), or this callback already left
        if status != "FINISHED":
            self.session.mark_failed(status)
        try:
            if not self.disabled:
                sections, summary = self.summarize(trainer)
                if not isinstance(sections, list):
                    raise TypeError(f"summarize returned {type(sections).__name__}, expected a list of ReportSection")
                self.session.add_summary(sections, summary)
        except Exception as error:
            log.warning("%s could not summarize: %s", type(self).__name__, error)
        finally:
            if self.session.available:
                self.stop_background_work()
            self.session.release(trainer, self, status)

    def on_session_start(self, trainer: Any, pl_module: Any) -> None:
        """Prepare measuring once the run folder and sink exist."""

    def stop_background_work(self) -> None:
        """Stop threads or recordings this callback started; called at the end even after an error."""

    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        """The report sections and `summary/...` metrics of this callback at the end of the run: the one way a
        callback adds to the report (work after the last exchange returns its section to `after_release`)."""
        return [], {}
