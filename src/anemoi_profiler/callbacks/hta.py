"""Holistic Trace Analysis of the run's own traces, after fit, without leaving MLflow.

Runs on rank 0 after the session's last exchange, when every rank has written its traces and the others are
free to exit, in a child process with a time and a memory limit (see `analysis`), so the training never fails
because of analysis.
Whatever happens, `hta/summary.json` says what ran, what was skipped and why.
"""

from __future__ import annotations

import json
from typing import Any

from anemoi_profiler.analysis import HtaNotInstalledError, NoTracesError, TraceError, analyze
from anemoi_profiler.callbacks.base import ProfilerCallback
from anemoi_profiler.logs import get_logger
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.run_files.layout import HTA_DIR, HTA_SUMMARY_FILE
from anemoi_profiler.trainer import trainer_info

log = get_logger(__name__)


class HtaCallback(ProfilerCallback):
    """Runs HTA on the run's trace windows at the end, on rank 0 after the other ranks are released, and logs
    its metrics under `hta/...`. Put it after TorchProfilerCallback (build_callbacks does), so the traces are
    complete when it runs.

    Args:
        config: The profiler's config, or what `ProfilerConfig.load` reads; used when `session` is None.
            None: the defaults.
        session: The session shared with the other callbacks of the run (`build_callbacks` passes it); None:
            one made from `config`, shared with the trainer's earlier profiler callbacks of an equal config.
    """

    def summarize(self, trainer: Any) -> tuple[list[ReportSection], dict[str, float]]:
        if self.session.is_global_zero and self.session.run_dir is not None:
            step = trainer_info.global_step(trainer)
            self.session.after_release(lambda: self._analyze(step))
        return [], {}

    def _analyze(self, step: int) -> ReportSection:
        """Every rank has written its traces (the session's last exchange) and is free to exit."""
        assert self.session.run_dir is not None
        out_dir = self.session.run_dir / HTA_DIR
        options = self.config.hta
        try:
            summary = analyze(self.session.run_dir, out_dir, options.time_limit_s, options.memory_limit_mb)
        except (NoTracesError, HtaNotInstalledError, TraceError) as error:
            reason = " ".join(str(error).split())
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / HTA_SUMMARY_FILE).write_text(json.dumps({"ran": [], "skipped": {"all": reason}}, indent=2))
            log.warning("HTA skipped: %s", reason)
            return ReportSection.key_values("HTA", {"skipped": (reason, "")})
        self.session.log_metrics(summary["metrics"], step)
        return self._section(summary)

    @staticmethod
    def _section(summary: dict[str, Any]) -> ReportSection:
        rows = []
        for window in summary["windows"]:
            name = window.get("window") or window["folder"]
            by_reason: dict[str, list[str]] = {}
            for analysis, reason in window["skipped"].items():
                by_reason.setdefault(reason, []).append(analysis)
            skipped = "; ".join(
                f"{'all' if len(names) == len(window['skipped']) and not window['ran'] else ', '.join(names)}: {reason}"
                for reason, names in by_reason.items()
            )
            rows.append([name, ", ".join(window["ran"]) or "-", skipped or "-"])
        note = f"Tables and summary.json in {summary['out_dir']}; metrics under hta/<stage>/window_<k>/rank<r>/."
        return ReportSection("HTA", ["window", "ran", "skipped (why)"], rows, {"metrics": summary["metrics"]}, note)
