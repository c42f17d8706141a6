"""Two runs side by side, with what got worse marked (`anemoi-profiler compare A B`).

A is the baseline, B the candidate: differences are B - A, and a row is worse when B is worse than A by more
than the threshold in the direction that matters (lower throughput, longer steps, more memory) and by more than
the absolute floors (a millisecond of data wait, a percent of the step). The table speaks the gate's language: a
worse row is a REGRESSION only where the gate (`compare --fail-if-slower`, `--fail-if-more-memory`) fails on its
figure, which is what exits 1; one value per run cannot tell a change from the runs' noise, so elsewhere it is
"worse, not settled". Runs are read from their run folders (or downloaded from MLflow), so a comparison needs no
tracking server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from anemoi_profiler import names
from anemoi_profiler.report_sections import format_value, plain_table
from anemoi_profiler.reports.charts import Chart, Series, to_svg
from anemoi_profiler.reports.cluster_view import cluster_view
from anemoi_profiler.reports.html import esc, html_page, html_table, svg_image
from anemoi_profiler.reports.run_data import RunData

REGRESSION_THRESHOLD_PCT = 5.0
"""Relative change in the worse direction above which a difference is a regression (run-to-run noise of
step times on a quiet machine is a few percent)."""
TOP_OPERATORS = 10
MAX_NAME_TEXT = 70
OPERATOR_MIN_SHARE = 0.01
"""An operator's change smaller than this share of the baseline's step time is noise, whatever its percent."""
DATA_WAIT_FLOOR_MS = 1.0
"""A change of the data wait smaller than this (ms per step) is never worse or better, whatever its percent: a
wait that short is the loader's hand-over, not a starved step, and its relative changes are noise (+0.1 ms
on a tenth of a millisecond reads +100 %)."""
STEP_SHARE_FLOOR = 0.01
"""Nor is a change of the data wait smaller than this share of the baseline's step time: it cannot move the
step by more than that, far under the threshold (a tenth of a millisecond more on a 300 ms step is no regression)."""
Status = Literal["regression", "improvement", ""]
"""A row's direction beyond the threshold and floors ("regression": B worse), before the gate says whether it
is settled (`Difference.word`)."""
UNSETTLED = "worse, not settled"
"""A worse row's word where the gate does not fail on its figure (no gate, or inconclusive, or not slower)."""


@dataclass(frozen=True)
class GateFailed:
    """What the gate failed on (exit 1): the slowdown (time and rate rows) and/or the memory (MB rows)."""

    slower: bool = False
    more_memory: bool = False


_WAIT = "dataloader wait"
COMPARED: tuple[tuple[str, str, str, bool], ...] = (
    (names.TRAIN_SAMPLES_PER_SEC, "training samples/s", "/s", True),
    (names.TRAIN_ITEMS_PER_SEC, "training items/s", "/s", True),
    (names.VAL_SAMPLES_PER_SEC, "validation samples/s", "/s", True),
    (names.TRAIN_MFU, "MFU", "%", True),
    (names.TRAIN_STEP_MS, "training step", "ms", False),
    (names.TRAIN_DATALOADER_WAIT_MS, _WAIT, "ms", False),
    (names.TRAIN_STEP_MS_MAX, "slowest rank's step", "ms", False),
    (names.VAL_STEP_MS, "validation step", "ms", False),
    (names.PEAK_ALLOCATED_MB, "peak allocated (GPU)", "MB", False),
    (names.PEAK_RESERVED_MB, "peak reserved (GPU)", "MB", False),
    (names.CPU_RSS_MB, "process RSS (CPU)", "MB", False),
)
"""Metrics compared: key, label, unit, whether higher is better. Rates and times at the run's steady state, as its
console, report and MLflow summary show them (`RunData.steady`), memory at its peak."""
SYSTEM_COMPARED: tuple[tuple[str, str, str, bool], ...] = (
    (names.cluster("gpu_utilization_percentage", "median"), "GPU utilisation, median GPU", "%", True),
    (names.cluster("gpu_utilization_percentage", "min"), "GPU utilisation, lowest GPU", "%", True),
)
"""From the run folder's per-GPU tables: each GPU's mean over the run, across the job's GPUs (`cluster_view`)."""
OVERLAID = {names.TRAIN_SAMPLES_PER_SEC: "Training samples/s", names.TRAIN_STEP_MS: "Training step ms"}
"""Metrics drawn for both runs over the steps on the HTML page."""
_CONTEXT = ("model", "device", "world size", "precision", "strategy", "versions")
"""What should match for a fair comparison; differences are listed above the numbers."""


@dataclass(frozen=True)
class Difference:
    label: str
    a: float | None
    b: float | None
    unit: str
    higher_is_better: bool
    threshold_pct: float
    min_delta: float = 0.0
    """Smaller absolute changes are never a regression or an improvement."""

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def pct(self) -> float | None:
        return None if self.delta is None or not self.a else 100 * self.delta / abs(self.a)

    @property
    def status(self) -> Status:
        if self.pct is None or abs(self.pct) <= self.threshold_pct or abs(self.delta or 0.0) < self.min_delta:
            return ""
        worse = self.pct < 0 if self.higher_is_better else self.pct > 0
        return "regression" if worse else "improvement"

    def settled(self, gate: GateFailed | None) -> bool:
        """A worse row the gate failed on: memory rows by the memory check, the others by the slowdown test."""
        failed = gate is not None and (gate.more_memory if self.unit == "MB" else gate.slower)
        return self.status == "regression" and failed

    def word(self, gate: GateFailed | None = None) -> str:
        """REGRESSION only where the gate failed on the row's figure; other worse rows are not settled."""
        if self.status == "regression":
            return "REGRESSION" if self.settled(gate) else UNSETTLED
        return self.status

    def cells(self, gate: GateFailed | None = None) -> list[str]:
        delta = "n/a" if self.delta is None else ("+" if self.delta > 0 else "") + format_value(self.delta)
        pct = "n/a" if self.pct is None else f"{self.pct:+.1f}%"
        return [self.label, format_value(self.a, self.unit), format_value(self.b, self.unit), delta, pct,
                self.word(gate)]  # fmt: skip


@dataclass
class Comparison:
    a: RunData
    b: RunData
    metrics: list[Difference]
    operators: list[Difference]
    operator_scope: str
    threshold_pct: float

    @property
    def worse(self) -> list[Difference]:
        """Rows with B worse than A beyond the threshold and floors, settled or not."""
        return [d for d in self.metrics + self.operators if d.status == "regression"]

    def regressions(self, gate: GateFailed | None) -> list[Difference]:
        """The worse rows the gate failed on: the only ones called a regression."""
        return [d for d in self.worse if d.settled(gate)]

    def summary(self, gate: GateFailed | None, ran: bool) -> str:
        """The line under the table; `ran`: a gate was asked for (`gate` is what it failed on, if anything)."""
        threshold = self.threshold_pct
        regressions = self.regressions(gate)
        unsettled = [d for d in self.worse if d not in regressions]
        parts = []
        if regressions:
            listed = ", ".join(f"{d.label} {d.pct:+.1f}%" for d in regressions)
            parts.append(
                f"{len(regressions)} REGRESSION(S) (B worse than A by more than {threshold:g}%, as the gate "
                f"found): {listed}"
            )
        if unsettled:
            listed = ", ".join(f"{d.label} {d.pct:+.1f}%" for d in unsettled)
            why = (
                "the gate above did not settle them"
                if ran
                else "one value per run cannot tell them from the runs' noise; --fail-if-slower tests that"
            )
            parts.append(
                f"{len(unsettled)} figure(s) worse than A by more than {threshold:g}%, not settled ({why}): {listed}"
            )
        return "; ".join(parts) + "." if parts else f"No regression above {threshold:g}%."

    def mismatched_context(self) -> dict[str, tuple[str, str]]:
        a, b = self.a.describe(), self.b.describe()
        return {key: (str(a.get(key)), str(b.get(key))) for key in _CONTEXT if a.get(key) != b.get(key)}


def compare_runs(a: RunData, b: RunData, threshold_pct: float = REGRESSION_THRESHOLD_PCT) -> Comparison:
    compared = [(label, _value(a, key), _value(b, key), unit, higher) for key, label, unit, higher in COMPARED]
    system_a, system_b = cluster_view(a.system_node_means()), cluster_view(b.system_node_means())
    compared += [
        (label, system_a.get(key), system_b.get(key), unit, higher) for key, label, unit, higher in SYSTEM_COMPARED
    ]
    wait_floor = max(DATA_WAIT_FLOOR_MS, STEP_SHARE_FLOOR * (_value(a, names.TRAIN_STEP_MS) or 0.0))
    metrics = [
        Difference(label, value_a, value_b, unit, higher, threshold_pct, wait_floor if label == _WAIT else 0.0)
        for label, value_a, value_b, unit, higher in compared
        if value_a is not None or value_b is not None
    ]
    device = _has_device_times(a) and _has_device_times(b)
    column = "self_device_ms" if device else "self_cpu_ms"
    ops_a, ops_b = _ms_per_step(a, column), _ms_per_step(b, column)
    busiest = sorted(set(ops_a) | set(ops_b), key=lambda op: max(ops_a.get(op, 0.0), ops_b.get(op, 0.0)), reverse=True)
    noise = OPERATOR_MIN_SHARE * (a.summary("train/step_ms") or sum(ops_a.values()))
    operators = [
        Difference(name, ops_a.get(name), ops_b.get(name), "ms", False, threshold_pct, noise)
        for name in busiest[:TOP_OPERATORS]
    ]
    scope = f"training, self {'device' if device else 'CPU'} ms per profiled step"
    return Comparison(a, b, metrics, operators, scope, threshold_pct)


def format_text(comparison: Comparison, gate: GateFailed | None = None, ran: bool = False) -> str:
    """The table; `gate`: what the gate failed on (its REGRESSION rows), `ran`: whether a gate was asked for."""
    a, b = comparison.a, comparison.b
    lines = [f"A (baseline): {a.folder}", f"B:            {b.folder}"]
    lines += [f"  differ in {key}: A {va} | B {vb}" for key, (va, vb) in comparison.mismatched_context().items()]
    columns = ["", "A", "B", "B - A", "%", ""]
    lines += ["", *plain_table(columns, [d.cells(gate) for d in comparison.metrics])]
    if comparison.operators:
        lines += ["", f"Top operators ({comparison.operator_scope})"]
        rows = [[_shorten(d.label), *d.cells(gate)[1:]] for d in comparison.operators]
        lines += plain_table(["operator", *columns[1:]], rows)
    lines += ["", comparison.summary(gate, ran)]
    return "\n".join(lines) + "\n"


def render_html(comparison: Comparison, verdict: str = "", gate: GateFailed | None = None) -> str:
    """The page; `verdict` is the gate's HTML (`regression_gate.verdict_html`), shown first; `gate` as for
    `format_text`."""
    a, b = comparison.a, comparison.b
    described_a, described_b = a.describe(), b.describe()
    keys = list(dict.fromkeys([*described_a, *described_b]))
    runs = html_table(["", "A (baseline)", "B"], [[k, described_a.get(k, ""), described_b.get(k, "")] for k in keys])
    columns = ["", "A", "B", "B - A", "%", ""]
    parts = [f"<h1>Comparison: {esc(a.title)} vs {esc(b.title)}</h1>", verdict, runs]
    parts.append(f"<p><b>{esc(comparison.summary(gate, bool(verdict)))}</b></p>")
    parts.append(_table(columns, comparison.metrics, gate))
    if comparison.operators:
        parts.append(f"<h2>Top operators ({esc(comparison.operator_scope)})</h2>")
        parts.append(_table(["operator", *columns[1:]], comparison.operators, gate, name_column=True))
    parts.append("<h2>Over the run</h2><div class='plots'>")
    for key, title in OVERLAID.items():
        if a.series(key)[0] or b.series(key)[0]:
            parts.append(f"<figure>{_overlay(key, title, a, b)}</figure>")
    parts.append("</div>")
    return html_page(f"compare {a.folder.name} {b.folder.name}", "".join(parts))


def _shorten(name: str) -> str:
    """Kernel names run to hundreds of characters of C++ templates; the console gets their start."""
    return name if len(name) <= MAX_NAME_TEXT else name[: MAX_NAME_TEXT - 3] + "..."


def _value(run: RunData, key: str) -> float | None:
    value = run.summary(key) if key.startswith(names.MEMORY) else run.steady(key)
    return value * 100 if value is not None and key.endswith("mfu") else value


def _has_device_times(run: RunData) -> bool:
    return any(w.get("device") for w in run.operator_windows("train"))


def _ms_per_step(run: RunData, column: str) -> dict[str, float]:
    """Each operator's time per profiled training step, over all training windows (windows differ in length)."""
    windows = run.operator_windows("train")
    steps = sum(int(w.get("steps") or 0) for w in windows)
    totals: dict[str, float] = {}
    for window in windows:
        for op in window.get("operators") or []:
            totals[op["operator"]] = totals.get(op["operator"], 0.0) + float(op.get(column) or 0.0)
    return {name: total / steps for name, total in totals.items()} if steps else {}


def _table(
    columns: list[str], differences: list[Difference], gate: GateFailed | None, name_column: bool = False
) -> str:
    rows = [d.cells(gate) for d in differences]
    classes = [
        ("regression" if d.settled(gate) else "worse") if d.status == "regression" else d.status for d in differences
    ]
    return html_table(columns, rows, name_column=name_column, row_classes=classes)


def _overlay(key: str, title: str, a: RunData, b: RunData) -> str:
    chart = Chart(title, x_label="step", y_min=0)
    for name, run in (("A", a), ("B", b)):
        steps, values = run.series(key)
        if steps:
            chart.series.append(Series(f"{name}: {run.folder.name}", steps, values, markers=True))
    return svg_image(to_svg(chart), title)
