"""`compare A B` on two real run folders (B sleeps in its training step): the slower run is worse, a regression
only where the gate fails on it."""

from __future__ import annotations

import base64
from argparse import ArgumentParser, Namespace
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import pytest

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.cli import compare_command
from anemoi_profiler.reports.compare import UNSETTLED, Difference, GateFailed, compare_runs, format_text
from anemoi_profiler.reports.run_data import RunData, load_run
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

OVERRIDES = [
    "tracking.enabled=false",
    "report.console=false",
    "system.enabled=false",
    "log_every_n_steps=4",
    "throughput.warmup_steps=2",
    "profiler.enabled=true",
    "profiler.validation=false",
    "profiler.train.skip_first=1",
    "profiler.train.wait=0",
    "profiler.train.warmup=1",
    "profiler.train.active=2",
]


def fit_run(output: Path, step_sleep_s: float) -> Path:
    config = ProfilerConfig.load(None, [f"output_dir={output}", *OVERRIDES])
    train, val = loaders(n_train=192)
    trainer(build_callbacks(config)).fit(TinyRegressor(step_sleep_s=step_sleep_s), train, val)
    (run_dir,) = run_folders(output)
    return run_dir


@pytest.fixture(scope="module")
def fast_and_slow(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return fit_run(tmp_path_factory.mktemp("fast"), 0.0), fit_run(tmp_path_factory.mktemp("slow"), 0.02)


def compare_args(*argv: str) -> Namespace:
    parser = ArgumentParser()
    compare_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_slower_run_is_worse_and_the_faster_an_improvement(fast_and_slow: tuple[Path, Path]) -> None:
    fast, slow = (load_run(path) for path in fast_and_slow)
    comparison = compare_runs(fast, slow)
    statuses = {d.label: d.status for d in comparison.metrics}
    assert statuses["training step"] == "regression" and statuses["training samples/s"] == "regression"
    step = next(d for d in comparison.metrics if d.label == "training step")
    # B sleeps 20 ms in every step: its step time holds them whatever the load (A's, fit first, may be slowed by it)
    assert step.b is not None and step.b >= 20 and step.delta is not None and step.delta > 0
    assert comparison.operators  # operators of the profiled steps, side by side
    text = format_text(comparison)  # no gate: worse, not a regression the runs' noise was tested against
    step_line = next(line for line in text.splitlines() if line.startswith("training step "))
    assert step_line.rstrip().endswith(UNSETTLED) and "REGRESSION" not in text
    assert "figure(s) worse than A by more than 5%, not settled (one value per run" in text and "step +" in text
    gated = format_text(comparison, GateFailed(slower=True), True)  # as `--fail-if-slower` prints it on exit 1
    step_line = next(line for line in gated.splitlines() if line.startswith("training step "))
    assert step_line.rstrip().endswith("REGRESSION")
    assert "REGRESSION(S) (B worse than A by more than 5%, as the gate found): " in gated
    reverse = {d.label: d.status for d in compare_runs(slow, fast).metrics}
    assert reverse["training step"] == "improvement" and reverse["training samples/s"] == "improvement"


def test_cli_prints_the_comparison_and_writes_a_self_contained_page(
    fast_and_slow: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "compare.html"
    assert compare_command.run(compare_args(*map(str, fast_and_slow), "--html", str(page_path))) == 0
    out = capsys.readouterr().out
    assert "A (baseline): " in out and "Top operators (training, self CPU ms per profiled step)" in out
    assert out.rstrip().endswith(f"written: {page_path}")
    page = page_path.read_text()
    rows = RowClasses()
    rows.feed(page)
    assert "worse" in rows.classes and "regression" not in rows.classes and "script" not in rows.tags
    plots = [base64.b64decode(src.split(",", 1)[1]) for src in rows.images]
    assert len(plots) == 2 and all(src.startswith("data:image/svg+xml;base64,") for src in rows.images)
    fast, slow = fast_and_slow
    for plot, title in zip(plots, ("Training samples/s", "Training step ms"), strict=True):  # a line for each run
        texts = ["".join(t.itertext()) for t in ElementTree.fromstring(plot).iter("{http://www.w3.org/2000/svg}text")]
        assert {title, f"A: {fast.name}", f"B: {slow.name}"} <= set(texts) and b"Matplotlib" in plot
    for external in ('src="http', 'href="http', "@import", "url(http"):
        assert external not in page


class RowClasses(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.classes: list[str] = []
        self.tags: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images += [value or "" for name, value in attrs if name == "src"]
        if tag == "tr":
            self.classes += [value or "" for name, value in attrs if name == "class"]


def test_errors_are_one_line(fast_and_slow: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert compare_command.run(compare_args(str(fast_and_slow[0]), str(tmp_path))) == 2
    assert compare_command.run(compare_args(str(fast_and_slow[0]), "no-such-run")) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"anemoi-profiler compare: {tmp_path} is not a run folder: none of report.json, metrics.json, "
        "environment.json in it",
        "anemoi-profiler compare: no such folder: no-such-run (for an MLflow run, give its id and --tracking-uri)",
    ]


@pytest.mark.parametrize(
    ("a", "b", "higher_is_better", "status"),
    [
        (100.0, 90.0, True, "regression"),  # throughput down 10%
        (100.0, 110.0, True, "improvement"),
        (100.0, 110.0, False, "regression"),  # step time up 10%
        (100.0, 104.0, False, ""),  # within the 5% threshold
        (None, 104.0, False, ""),  # nothing to compare with
        (0.0, 3.0, False, ""),  # no percentage from zero
        (0.1, 0.2, False, ""),  # +100%, but below the noise floor
    ],
)
def test_difference_direction_threshold_and_noise_floor(
    a: float | None, b: float | None, higher_is_better: bool, status: str
) -> None:
    assert Difference("x", a, b, "ms", higher_is_better, 5.0, min_delta=0.5).status == status


def test_differences_in_hardware_or_precision_are_listed_first() -> None:
    a = RunData(Path("a"), header={"model": "Net", "device": "NVIDIA H200", "precision": "bf16-mixed"})
    b = RunData(Path("b"), header={"model": "Net", "device": "NVIDIA A100", "precision": "bf16-mixed"})
    text = format_text(compare_runs(a, b))
    assert text.splitlines()[2] == "  differ in device: A NVIDIA H200 | B NVIDIA A100"
    assert "No regression above 5%." in text
