"""The diagnosis as the MLflow run's description: Markdown, so the run page says what limits the run.

Most important first (verdicts, then the headline figures, then where the full report is), because MLflow's
limit on a description may cut the end off. The same figures as report.html's tiles, from the same `RunData`.
"""

from __future__ import annotations

from anemoi_profiler import names
from anemoi_profiler.report_sections import format_value
from anemoi_profiler.reports.diagnosis import NotAssessed, Outcome, fired
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.reports.steady import LABEL

HEADING = "**anemoi-profiler: what limits this run**"
WINDOWS_SECTION = "Profiling windows"
"""The report section that lists every profiling window (`run.window_triggers.windows_section`)."""
KEY_FIGURES = {
    names.TRAIN_SAMPLES_PER_SEC: ("training samples/s", ""),
    names.TRAIN_ITEMS_PER_SEC: ("training items/s", ""),
    names.VAL_SAMPLES_PER_SEC: ("validation samples/s", ""),
    names.TRAIN_STEP_MS: ("training step", "ms"),
    names.TRAIN_DATALOADER_WAIT_MS: ("dataloader wait", "ms"),
}
"""Per-interval metrics shown at the run's steady state (`reports.steady`; what the diagnosis reads too)."""


def key_figures(run: RunData) -> dict[str, str]:
    """The headline figures that the run has: steady-state rates and times (`reports.steady`), MFU, peak memory."""
    values = {label: format_value(run.steady(key), unit) for key, (label, unit) in KEY_FIGURES.items()}
    mfu = run.steady(names.TRAIN_MFU)
    values["MFU"] = f"{mfu * 100:.2g}%" if mfu is not None else "n/a"
    values["peak allocated (GPU)"] = format_value(run.summary(names.PEAK_ALLOCATED_MB), "MB")
    return {label: value for label, value in values.items() if value != "n/a"}


def run_description(run: RunData, outcomes: dict[str, Outcome], report_location: str) -> str:
    """The profiler's section of the description; `report_location` says where report.html is."""
    lines = [HEADING, ""]
    status = run.header.get("status")
    if status and status != "FINISHED":
        lines += [f"The run ended **{md(status)}**: the figures cover what was measured until then.", ""]
    verdicts = fired(outcomes)
    for verdict in verdicts:
        searched_as = f", `{verdict.id}`" if verdict.id != verdict.name else ""  # the id a search takes
        lines += [
            f"- **{md(verdict.name)}** ({verdict.severity}{searched_as}): {md(verdict.value)}.  ",
            f"  {md(verdict.message)}  ",
            f"  *Next:* {md(verdict.next_step)}",
        ]
    if not verdicts:
        checked = [name for name, outcome in outcomes.items() if not isinstance(outcome, NotAssessed)]
        lines.append(f"No limiter found (checked with data: {', '.join(checked) or 'none'}).")
    figures = key_figures(run)
    if figures:
        lines += ["", f"{LABEL.capitalize()}: " + " · ".join(f"{label} **{md(v)}**" for label, v in figures.items())]
    triggered = triggered_windows(run)
    if triggered:
        lines += ["", "Profiling windows opened by a trigger or a request: " + "; ".join(map(md, triggered)) + "."]
    lines += ["", f"Full report with plots and operator tables: {report_location}."]
    not_assessed = {name: o.reason for name, o in outcomes.items() if isinstance(o, NotAssessed)}
    if not_assessed:
        reasons = "; ".join(f"{name} ({md(reason)})" for name, reason in not_assessed.items())
        lines += ["", f"Not assessed: {reasons}."]
    return "\n".join(lines)


def triggered_windows(run: RunData) -> list[str]:
    """`train window 2 (drift) at batch 121 on ranks 0,1` for each window not from the schedule."""
    windows = run.sections.get(WINDOWS_SECTION, {}).get("data", {}).get("windows", [])
    return [
        f"{w['stage']} window {w['window']} ({w['reason']}) at batch {w['start_batch']} on ranks "
        + ",".join(map(str, w["ranks"]))
        for w in windows
        if w.get("reason") != "schedule"
    ]


def md(text: object) -> str:
    """Text from a measurement or a user's name, with Markdown's emphasis and markup characters escaped."""
    escaped = str(text)
    for character in "\\`*_[]<>|#":
        escaped = escaped.replace(character, "\\" + character)
    return escaped
