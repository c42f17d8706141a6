"""Holistic Trace Analysis of the run's own traces, after fit, without leaving MLflow.

Runs on rank 0 once every rank has finished writing its traces (a barrier on the profiler's own group),
in a child process with a time limit (see `analysis`), so the training never fails because of analysis.
Whatever happens, `hta/summary.json` says what ran, what was skipped and why.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..analysis import HtaNotInstalledError, NoTracesError, TraceError, analyze
from ..layout import HTA_DIR, HTA_SUMMARY_FILE
from ..report import ReportSection
from ..run import trainer_info
from .base import ProfilerCallback

log = logging.getLogger(__name__)


class HtaCallback(ProfilerCallback):
    """Put it after TorchProfilerCallback (build_callbacks does), so the traces are complete when it runs."""

    def summarize(self, trainer: Any) -> tuple[ReportSection | None, dict[str, float]]:
        if not self.session.failed:
            self.session.exchange.gather([0.0])  # every rank has written its traces
        if not self.session.is_global_zero or self.session.run_dir is None:
            return None, {}
        out_dir = self.session.run_dir / HTA_DIR
        try:
            summary = analyze(self.session.run_dir, out_dir, self.config.hta.time_limit_s)
        except (NoTracesError, HtaNotInstalledError, TraceError) as error:
            reason = " ".join(str(error).split())
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / HTA_SUMMARY_FILE).write_text(json.dumps({"ran": [], "skipped": {"all": reason}}, indent=2))
            log.warning("anemoi-profiler: HTA skipped: %s", reason)
            return ReportSection.key_values("HTA", {"skipped": (reason, "")}), {}
        self.session.log_metrics(summary["metrics"], trainer_info.global_step(trainer))
        return self._section(summary), {}

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
