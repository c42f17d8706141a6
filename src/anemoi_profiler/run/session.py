"""One profiled fit: its config, run folder, stage clock, tracking sink and report, shared by the callbacks.

Callbacks attach in `setup` and release in `teardown` or `on_exception`. The first attach creates the run
folder and the sink; the last release writes the report and closes the sink. So every callback also works
alone (it makes its own session), and `build_callbacks` shares one session between them.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from anemoi_profiler.clock import IntervalListener, OwnWorkClock, StageClock
from anemoi_profiler.clock.clock_callback import StageClockCallback
from anemoi_profiler.config import ProfilerConfig
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.distributed.gradient_sync import GradientSyncTimer
from anemoi_profiler.distributed.parallelism import Parallelism, detect_parallelism
from anemoi_profiler.distributed.profiled_ranks import describe_ranks, select_profiled_ranks
from anemoi_profiler.logs import get_logger
from anemoi_profiler.postmortem import PostmortemRecorder
from anemoi_profiler.redaction import redact_uri
from anemoi_profiler.report_sections import ReportSection, RunReport
from anemoi_profiler.reports.diagnosis import Outcome, assess, render_section
from anemoi_profiler.reports.run_data import RunData, load_run
from anemoi_profiler.run import run_page
from anemoi_profiler.run.environment import collect_environment, report_header
from anemoi_profiler.run.folder import print_mlflow_run, print_where_to_look, upload_folder, write_run_folder
from anemoi_profiler.run.spooled_sink import open_sink
from anemoi_profiler.run.window_triggers import TriggerWatch
from anemoi_profiler.run_files.metrics_file import MetricHistory
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.tracking.uris import resolve_tracking_uri
from anemoi_profiler.trainer import trainer_info

log = get_logger(__name__)


class ProfilerSession:
    def __init__(self, config: ProfilerConfig | None = None) -> None:
        self.config = config or ProfilerConfig()
        self.run_dir: Path | None = None
        self.sink: TrackingSink | None = None
        self.tracking_uri: str | None = None
        self.global_rank = 0
        self.local_rank = 0
        self.world_size = 1
        self.parallelism = Parallelism(1, 1, "one process")
        self.hosts: list[str] = []
        """Each rank's host name, by global rank."""
        self.profiled_ranks: list[int] = [0]
        """The ranks that record the scheduled profiling windows (`distributed.profiled_ranks`)."""
        self._members: set[int] = set()
        self._kept_local: set[Path] = set()
        self._report: RunReport | None = None
        self._read_back: tuple[RunData, dict[str, Outcome]] | None = None  # the run as its reports show it
        self._summary_metrics: dict[str, float] = {}
        self._after_release: list[Callable[[], ReportSection | None]] = []
        self.history = MetricHistory()
        self._started = 0.0
        self._status = "FINISHED"
        self.exchange = RankExchange()  # local until the session starts on every rank
        self.own_work = OwnWorkClock()
        self.stage_clock: StageClock | None = None  # made when the session starts, for the interval callbacks
        self.clock_callback: StageClockCallback | None = None  # in the trainer while an interval callback listens
        self.triggers: TriggerWatch | None = None  # with triggers.enabled: the detectors and their window plans
        self.end_seconds: dict[str, float] = {}  # what the end of the last fit spent on each of its steps
        self.postmortem = PostmortemRecorder(self.config.postmortem)  # before the process group: Flight Recorder

    def startup_work_until(self) -> float | None:
        """`perf_counter` when the profiler's own start-up beside the training ended on this rank (the MLflow
        sender's first report), now if it goes on; None when this rank has no sink."""
        if self.sink is None:
            return None
        return self.sink.started_up_at or time.perf_counter()

    @property
    def failed(self) -> bool:
        """True once any member ended with an error: ranks may be out of step, so no more collectives."""
        return self._status != "FINISHED"

    @property
    def available(self) -> bool:
        """False when the profiler could not start (say, an unwritable output folder): it stays off."""
        return self.run_dir is not None

    def is_member(self, member: object) -> bool:
        return id(member) in self._members

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    # ---- lifecycle ----
    def attach(self, trainer: Any, member: object) -> bool:
        """Join the session; the first member starts it (run folder, config copy, environment, sink).

        Returns False when the profiler cannot run (said once, in a warning): the training must go on.
        """
        if not self._members:
            try:
                self._start(trainer)
            except Exception as error:
                self.run_dir = None
                if self.sink is not None:  # started before the failure: stop its thread, keep its spool
                    self.sink.close("KILLED", timeout_s=0.0)
                    self.sink = None
                log.warning(
                    "could not start (%s: %s); the profiler is off for this run, training goes on",
                    type(error).__name__,
                    error,
                )
        self._members.add(id(member))
        return self.available

    def join_clock(self, listener: IntervalListener, trainer: Any) -> StageClock:
        """Hand `listener` the clock's log-interval reports. The first listener's join puts the one callback
        that drives the clock (`clock_callback`) into the trainer, right after the listener; `_finish` takes it
        out."""
        assert self.stage_clock is not None, "the session makes its stage clock when it starts"
        if self.clock_callback is None:
            self.clock_callback = StageClockCallback(self, self.stage_clock)
            self.clock_callback.install(trainer, after=listener)
        self.stage_clock.join(listener)
        return self.stage_clock

    def mark_failed(self, status: str) -> None:
        self._status = status

    def release(self, trainer: Any, member: object, status: str = "FINISHED") -> None:
        """Leave the session; the last member to leave finishes it with the worst status seen."""
        if id(member) not in self._members:
            return
        if status != "FINISHED":
            self._status = status
        self._members.discard(id(member))
        if not self._members:
            self._finish(trainer)

    def _start(self, trainer: Any) -> None:
        self.global_rank = trainer_info.global_rank(trainer)
        self.local_rank = trainer_info.local_rank(trainer)
        self.world_size = trainer_info.world_size(trainer)
        ranks_per_node = self.world_size // trainer_info.num_nodes(trainer)
        self.exchange = RankExchange(self.config.distributed.timeout_s, ranks_per_node=ranks_per_node or None)
        self.hosts = self.exchange.gather_texts(socket.gethostname())
        setting = self.config.distributed.profiled_ranks
        self.profiled_ranks = select_profiled_ranks(setting, self.world_size, self.hosts)
        if self.is_global_zero and len(self.profiled_ranks) < self.world_size:
            log.info(
                "profiling windows record on ranks %s (distributed.profiled_ranks: %s)",
                describe_ranks(self.profiled_ranks, self.world_size),
                setting,
            )
        distributed = self.config.distributed
        strategy = getattr(trainer, "strategy", None)
        self.parallelism = detect_parallelism(strategy, self.world_size, distributed.data_parallel_size)
        device = trainer_info.root_device(trainer)
        self.own_work = OwnWorkClock()
        self.stage_clock = StageClock(
            self.config,
            device,
            self.exchange,
            self.own_work,
            GradientSyncTimer(device, self.parallelism.data_parallel_size, distributed.straggler),
            lambda: not self.failed,
        )
        self.clock_callback = None
        self.triggers = None
        self._started = time.time()
        self._status = "FINISHED"
        self._summary_metrics = {}
        self._after_release = []
        self.history = MetricHistory()
        self.run_dir = None
        self._report = None
        self._read_back = None
        self.sink = None
        header: dict[str, Any] = {}
        environment: dict[str, Any] = {}
        run_dir = self._write_run_folder(trainer, environment, header) if self.is_global_zero else None
        # Every rank learns whether rank 0 could write the run folder, so they all stay in step: on the profiler's
        # gloo groups, as every exchange of its own (never the strategy's device collectives; see `exchange`).
        shared = self.exchange.broadcast_text(str(run_dir) if run_dir else "")
        if not shared:
            return
        self.run_dir = Path(shared)
        if self.config.triggers.enabled:
            self.triggers = TriggerWatch.of_config(
                self.config, self.world_size, self.global_rank, self.run_dir, self.exchange, self.profiled_ranks
            )
            self.stage_clock.train_exchanges.append(self.triggers)
        self._report = RunReport({"run folder": str(self.run_dir), **header})
        self._start_sink(trainer, environment)
        metrics = self.history.write if self.is_global_zero else None
        self.postmortem.start(self.run_dir, self.global_rank, self.world_size, self.sink, metrics)

    def _write_run_folder(self, trainer: Any, environment: dict[str, Any], header: dict[str, Any]) -> Path | None:
        """Rank 0: create the run folder with the config and the environment (collected into `environment`);
        None when the disk refuses."""
        try:
            environment.update(collect_environment(trainer))
            environment.update(
                hosts=self.hosts,
                data_parallel_size=self.parallelism.data_parallel_size,
                data_parallel_source=self.parallelism.source,
            )
            run_dir = write_run_folder(self.config, environment)
        except OSError as error:
            log.warning(
                "cannot write a run folder below %s (%s: %s); the profiler is off for this run, "
                "training goes on. Set output_dir to a writable folder.",
                Path(self.config.output_dir).resolve(),
                type(error).__name__,
                error.strerror or error,
            )
            return None
        header.update(report_header(environment, trainer))
        header["profiled ranks"] = describe_ranks(self.profiled_ranks, self.world_size)
        return run_dir

    def _start_sink(self, trainer: Any, environment: dict[str, Any]) -> None:
        tracking = self.config.tracking
        logger = trainer_info.find_mlflow_logger(trainer)
        logger_uri = trainer_info.logger_tracking_uri(logger) if logger is not None else None
        if logger is not None and tracking.uri and tracking.uri != logger_uri:
            log.warning(
                "tracking.uri=%s is ignored: the trainer's MLFlowLogger logs to %s and the "
                "profiler writes into the logger's run",
                redact_uri(tracking.uri),
                redact_uri(logger_uri or ""),
            )
        self.tracking_uri = resolve_tracking_uri(None if logger else tracking.uri, logger_uri, self.config.output_dir)
        if not tracking.enabled:
            return
        run_id = logger.run_id if logger is not None else None
        prefix = trainer_info.logger_prefix(logger) if logger is not None else ""
        # Only rank 0 talks to MLflow: the other nodes' system samples reach it through the exchange.
        if self.is_global_zero:
            self.sink = self._open_sink(run_id, prefix)
        if self.is_global_zero and self.sink is not None and self.run_dir is not None:
            device = str(trainer_info.root_device(trainer))
            run_page.start(self.sink, self.config, self.run_dir, environment, device, trainer_info.num_devices(trainer))

    def _open_sink(self, run_id: str | None, key_prefix: str) -> TrackingSink | None:
        assert self.run_dir is not None and self.tracking_uri is not None
        return open_sink(
            self.config,
            self.run_dir,
            self.global_rank,
            self.tracking_uri,
            run_name=self.config.tracking.run_name or self.run_dir.name,
            run_id=run_id,
            key_prefix=key_prefix,
        )

    def _finish(self, trainer: Any) -> None:
        """Write the report, send the summary and the run folder, close the sink; never raise into training."""
        if self.clock_callback is not None:
            self.clock_callback.remove()  # out of the trainer: the clock measures no more
        self.postmortem.close()
        if self.run_dir is not None and not self.failed:
            self.exchange.gather([0.0])  # barrier: every rank has written its files before rank 0 uploads
        self.exchange.close()  # the last collective is behind us: gloo's threads end now, not at exit
        if self.run_dir is None:
            return  # the profiler could not start on any rank: nothing to finish
        run_dir, sink, clock = self.run_dir, self.sink, self.stage_clock
        reporting = self.is_global_zero and self._report is not None
        # What was measured goes to disk first: a SIGKILL while the report is written then loses none of it.
        steps: list[tuple[str, Callable[[], object]]] = []
        sending = False  # the MLflow sender goes on delivering after the fit
        if sink is not None:
            steps.append(("spool the metrics", sink.spool_now))
        if self.is_global_zero and clock is not None:
            steps.append(("write the step record", functools.partial(clock.steps.write, run_dir, self.global_rank)))
        if self.is_global_zero:
            steps.append(("finish rank 0's work", self._run_after_release))
        if reporting:
            steps.append(("write the report", functools.partial(self._write_report, trainer)))
        if reporting and self.config.report.html:
            steps.append(("write report.html", self._write_html_report))
        if sink is not None:
            if reporting:
                steps.append(("describe the MLflow run", functools.partial(self._describe_run, sink)))
                steps.append(("tag the post-mortem", functools.partial(self.postmortem.tag_run, sink)))
            # after rank 0's work, which adds summary values of its own
            steps.append(("log summary metrics", functools.partial(self._log_summary_metrics, sink, trainer)))
            if self.is_global_zero and self.config.tracking.upload_artifacts:
                steps.append(
                    ("upload the run folder", functools.partial(upload_folder, sink, run_dir, self._kept_local))
                )
            # A fit that finishes before the sender is up (it imports MLflow and creates the run beside the first
            # steps) does not wait for that start-up: the sender delivers in the background, and the process's
            # exit or `wait_for_mlflow` waits for it. Otherwise the run is in MLflow, ended, when `fit()` returns;
            # always so for a failed or stopped fit, whose process may end without running its exit handlers.
            sending = self._status == "FINISHED" and not sink.sender_up
            close = functools.partial(sink.close, self._status, self.config.tracking.close_timeout_s, wait=not sending)
            if sending and self.is_global_zero:
                close = functools.partial(close, when_delivered=functools.partial(print_mlflow_run, run_dir, sink))
            steps.append(("close the MLflow sink", close))
        if self.is_global_zero:
            steps.append(
                ("print where to look", functools.partial(print_where_to_look, run_dir, sink, sending=sending))
            )
        self.end_seconds = {}
        for what, action in steps:
            started = time.perf_counter()
            try:
                action()
            except Exception as error:
                log.warning("could not %s: %s: %s", what, type(error).__name__, error)
            self.end_seconds[what] = time.perf_counter() - started
        log.debug(
            "the end of the run took %s",
            ", ".join(f"{k} {v:.2f} s" for k, v in self.end_seconds.items()),
        )

    def _log_summary_metrics(self, sink: TrackingSink, trainer: Any) -> None:
        if self._summary_metrics:
            sink.log_metrics(self._summary_metrics, trainer_info.global_step(trainer))

    def _run_after_release(self) -> None:
        for work in self._after_release:
            try:
                self.add_summary([work()])
            except Exception as error:
                log.warning("%s failed: %s: %s", getattr(work, "__name__", work), type(error).__name__, error)

    def _write_report(self, trainer: Any) -> None:
        """metrics.json; the run read back and diagnosed, once (report.html and the run page show the same);
        report.txt and report.json with the diagnosis first."""
        assert self._report is not None and self.run_dir is not None
        report = self._report
        report.header.update(
            status=self._status,
            duration=f"{time.time() - self._started:.1f} s",
            steps=trainer_info.global_step(trainer),
            **self.postmortem.header(),
        )
        self.history.add(self._summary_metrics, trainer_info.global_step(trainer))
        self.history.write(self.run_dir)
        self._read_back = self._read_back_and_diagnose(report)
        if self._read_back is not None:
            report.sections.insert(0, render_section(self._read_back[1]))
        report.write(self.run_dir, txt=self.config.report.txt, as_json=self.config.report.json)
        if self.config.report.console:
            report.print_console()

    def _read_back_and_diagnose(self, report: RunReport) -> tuple[RunData, dict[str, Outcome]] | None:
        """The run as `anemoi-profiler report` reads it later (the report's sections from memory: report.json
        is written after the diagnosis it opens with) and what each check finds; None, said once, when the
        run folder cannot be read back."""
        assert self.run_dir is not None
        try:
            run = load_run(self.run_dir, report.to_json())
            return run, assess(run)
        except Exception as error:
            log.warning(
                "no diagnosis, report.html or run description: cannot read the run folder back: %s: %s",
                type(error).__name__,
                error,
            )
            return None

    def _write_html_report(self) -> None:
        from anemoi_profiler.reports.html import write_html_report  # the report modules, at the end only

        if self._read_back is not None:  # else the report's step said why
            write_html_report(*self._read_back)  # and plots/*.svg, uploaded with the run folder

    def _describe_run(self, sink: TrackingSink) -> None:
        if self._read_back is not None:  # else the report's step said why
            run_page.finish(sink, self.config, *self._read_back)

    # ---- what callbacks call ----
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Queue metrics for MLflow and metrics.json; returns at once (the sink sends from its own thread)."""
        if not metrics:
            return
        self.history.add(metrics, step)
        if self.sink is not None:
            self.sink.log_metrics(metrics, step)

    def log_params(self, params: dict[str, Any]) -> None:
        if self.sink is not None and params:
            self.sink.log_params(params)

    def after_release(self, work: Callable[[], ReportSection | None]) -> None:
        """Rank 0's work after the last exchange, when the other ranks are free to exit (an HTA analysis, say):
        it runs before the report is written, and its section goes in the report."""
        self._after_release.append(work)

    def keep_local(self, path: Path) -> None:
        """Keep a file or folder of the run folder out of the MLflow upload (e.g. traces over the size cap)."""
        self._kept_local.add(Path(path).resolve())

    def add_summary(
        self, sections: Iterable[ReportSection | None], summary_metrics: dict[str, float] | None = None
    ) -> None:
        """Add report sections and end-of-run `summary/...` values (rank 0 writes them): what a member's
        `summarize` returns, and what work after the release (`after_release`) gives."""
        if self._report is not None:
            for section in sections:
                self._report.add(section)
        self._summary_metrics.update(summary_metrics or {})
