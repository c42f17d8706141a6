"""report.html from a real profiled fit: one self-contained page, diagnosis first, every name escaped; the
`report` command that regenerates it; and the page as a browser renders it (headless Chromium)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from argparse import ArgumentParser, Namespace
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch
from matplotlib.image import imread
from mlflow.tracking import MlflowClient

from anemoi_profiler import ProfilerConfig, build_callbacks, names
from anemoi_profiler.cli import report_command
from anemoi_profiler.reports.diagnosis import assess
from anemoi_profiler.reports.html import render_html, write_html_report
from anemoi_profiler.reports.plots import charts, figures, write_plot_files
from anemoi_profiler.reports.run_data import RunData, load_run
from anemoi_profiler.run_files.layout import run_folders
from tests.helpers.lightning_models import TinyRegressor, loaders, trainer

PLANTED_OP = "<script>alert('op')</script>"
PLANTED_MODEL = "<script>alert('model')</script>"
CHROMIUM = Path("/usr/bin/chromium")
OVERRIDES = [
    "tracking.enabled=false",
    "report.console=false",
    "log_every_n_steps=4",
    "throughput.warmup_steps=2",
    "system.interval_s=0.5",
    "profiler.enabled=true",
    "profiler.train.skip_first=1",
    "profiler.train.wait=1",
    "profiler.train.warmup=1",
    "profiler.train.active=2",
    "model_summary.enabled=true",
    "hta.enabled=true",
]


class AnnotatedRegressor(TinyRegressor):
    """Runs its forward inside a profiler annotation whose name is markup, as a user's name could be."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function(PLANTED_OP):
            return self.net(x)


PlantedModel = type(PLANTED_MODEL, (AnnotatedRegressor,), {})


class PageParser(HTMLParser):
    """What a browser would build: tags, ids, text; scripts and external references counted."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.section_ids: list[str] = []
        self.image_sources: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "section":
            self.section_ids += [value for name, value in attrs if name == "id" and value]
        if tag == "img":
            self.image_sources += [value or "" for name, value in attrs if name == "src"]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("runs")
    config = ProfilerConfig.load(None, [f"output_dir={output}", *OVERRIDES])
    train, val = loaders()
    trainer(build_callbacks(config)).fit(PlantedModel(), train, val)
    (run_dir,) = run_folders(output)
    return run_dir


def test_the_page_is_self_contained_with_every_part(profiled_run: Path) -> None:
    page = (profiled_run / "report.html").read_text()
    parsed = parse(page)
    for external in ('src="http', "src='http", 'href="http', "href='http", "@import", "url(http", "url('http"):
        assert external not in page, external
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert parsed.section_ids == ["diagnosis", "plots", "operators", "model", "hta", "tables"]
    # throughput, step time, memory, system: embedded, the very files of plots/*.svg
    assert len(parsed.image_sources) == 4
    plot_files = sorted((profiled_run / "plots").glob("*.svg"))
    embedded = sorted(base64.b64decode(src.split(",", 1)[1]) for src in parsed.image_sources)
    assert all(src.startswith("data:image/svg+xml;base64,") for src in parsed.image_sources)
    assert embedded == sorted(path.read_bytes() for path in plot_files)
    text = " ".join(parsed.text)
    for expected in ("training samples/s", "Top operators", "Memory by operator", "Model summary", "Throughput"):
        assert expected in text, expected
    assert "How to read this table:" in text and "Negative values are frees" in text
    assert "no GPU kernels in the trace (CPU-only profile)" in text  # HTA's reason, shown for each window
    assert text.index("Diagnosis") < text.index("Top operators")


def test_names_from_the_model_and_the_trace_are_escaped(profiled_run: Path) -> None:
    page = (profiled_run / "report.html").read_text()
    assert "<script" not in page
    assert html_escaped(PLANTED_OP) in page  # in the operator tables
    assert html_escaped(PLANTED_MODEL) in page  # in the title, the header and the model summary
    text = " ".join(parse(page).text)
    assert PLANTED_OP in text and PLANTED_MODEL in text  # what the reader sees is the name itself


def html_escaped(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#x27;")


def test_hta_results_with_rank_table_and_kernels() -> None:
    hta = {
        "windows": [
            {
                "window": "train/window_0",
                "ranks": [0, 1],
                "metrics": {
                    names.hta_rank(0, "idle_pct"): 53.6,
                    names.hta_rank(1, "idle_pct"): 54.7,
                    names.hta_rank(0, "comm_comp_overlap_pct"): 11.8,
                    names.hta_all_ranks("communication_kernel_time_pct"): 55.5,
                },
                "top_kernels": [
                    {"name": "<script>x</script>ncclKernel", "kernel_type": "COMM", "pct_of_kernel_time": 59.7}
                ],
                "ran": ["temporal_breakdown", "comm_comp_overlap"],
                "skipped": {"critical_path": "no CUDA synchronization events"},
                "failed": {},
                "warnings": [],
            }
        ]
    }
    run = RunData(Path("run"), hta=hta)
    page = render_html(run, assess(run))
    text = " ".join(parse(page).text)
    assert "comm/comp overlap %" in text and "11.80" in text
    assert "GPU kernel time (all ranks): communication 55.5%" in text
    assert "&lt;script&gt;x&lt;/script&gt;ncclKernel" in page and "<script" not in page
    assert "no CUDA synchronization events" in text


def test_operator_tables_from_the_report_files_without_report_json(profiled_run: Path, tmp_path: Path) -> None:
    run_dir = Path(shutil.copytree(profiled_run, tmp_path / "run", ignore=shutil.ignore_patterns("report.*")))
    run = load_run(run_dir)
    text = " ".join(parse((write_html_report(run, assess(run))).read_text()).text)
    assert "Time by operator (train window 0)" in text and "Memory by operator (val window 0)" in text
    assert PLANTED_OP in text and "How to read this table:" in text


def test_plot_files_for_mlflow_and_figures_for_a_notebook(profiled_run: Path) -> None:
    before = {path.name: path.read_bytes() for path in (profiled_run / "plots").glob("*.svg")}
    written = write_plot_files(profiled_run)  # drawn again: what `anemoi-profiler report` does
    assert [p.name for p in written] == ["throughput.svg", "step_time.svg", "memory.svg", "system.svg"]
    assert {path.name: path.read_bytes() for path in written} == before  # the same run, the same files
    shown = charts(profiled_run)
    for path in written:
        svg = path.read_text()
        root = ElementTree.fromstring(svg)  # well-formed, a document of its own
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and path.parent == profiled_run / "plots"
        assert "Matplotlib" in svg
        texts = {"".join(element.itertext()) for element in root.iter("{http://www.w3.org/2000/svg}text")}
        chart = shown[path.stem]
        assert {chart.title, chart.x_label, chart.y_label} <= texts, path.name
        assert {series.label for series in chart.series} <= texts, path.name  # each series, in the legend
    titles = {name: chart.title for name, chart in shown.items()}
    drawn = {name: figure.axes[0].get_title(loc="left") for name, figure in figures(profiled_run).items()}
    assert drawn == titles and titles["throughput"] == "Throughput"
    throughput = figures(profiled_run)["throughput"].axes[0]
    assert [line.get_label() for line in throughput.get_lines()] == ["train samples/s", "val samples/s"]


def report_args(*argv: str) -> Namespace:
    parser = ArgumentParser()
    report_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_report_command_puts_a_fresh_diagnosis_first(profiled_run: Path, tmp_path: Path) -> None:
    run_dir = Path(shutil.copytree(profiled_run, tmp_path / profiled_run.name))
    (run_dir / "report.html").unlink()
    for _ in range(2):  # a second run replaces the diagnosis, never adds another
        assert report_command.run(report_args(str(run_dir))) == 0
    sections = list(json.loads((run_dir / "report.json").read_text())["sections"])
    assert sections[0] == "Diagnosis" and sections.count("Diagnosis") == 1 and "Throughput" in sections
    text = (run_dir / "report.txt").read_text()
    assert text.index("Diagnosis\n---------") < text.index("Throughput\n----------")
    assert (run_dir / "report.html").is_file()


def test_report_command_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_command.run(report_args(str(tmp_path))) == 1
    assert report_command.run(report_args("0123abcd")) == 1  # no such folder, no tracking URI
    assert report_command.run(report_args("../no/such", "--tracking-uri", "sqlite:///x.db")) == 1  # never a path
    errors = capsys.readouterr().err.splitlines()
    assert errors == [
        f"anemoi-profiler report: {tmp_path} is not a run folder: none of report.json, metrics.json, "
        "environment.json in it",
        "anemoi-profiler report: no such folder: 0123abcd (for an MLflow run, give its id and --tracking-uri)",
        "anemoi-profiler report: no such folder: ../no/such (nor an MLflow run id: letters, digits, '-' and '_')",
    ]
    assert not list(tmp_path.glob("report_*"))


def test_report_command_downloads_an_mlflow_run(profiled_run: Path, tmp_path: Path, sqlite_uri: str) -> None:
    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("reports", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_artifacts(run_id, str(profiled_run), "profiler")  # as the session uploads it, traces included
    output = tmp_path / "downloaded"
    assert report_command.run(report_args(run_id, "--tracking-uri", sqlite_uri, "--output", str(output))) == 0
    downloaded = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
    # the plots are drawn again with report.html (and windows.json is there: the step-time plot marks windows)
    assert downloaded == [
        "config.yaml", "environment.json", "hta/summary.json", "memory_report.json", "metrics.json",
        "model_summary.txt", "plots/memory.svg", "plots/step_time.svg", "plots/system.svg", "plots/throughput.svg",
        "report.html", "report.json", "report.txt", "steps.json", "time_report.json", "windows.json",
    ]  # fmt: skip
    assert html_escaped(PLANTED_OP) in (output / "report.html").read_text()
    assert report_command.run(report_args("f" * 32, "--tracking-uri", sqlite_uri)) == 1


def test_report_renders_in_headless_chromium(profiled_run: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium) to render report.html headless")
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
         "--enable-logging=stderr", "--v=0", (profiled_run / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "net::ERR" in line]
    assert console == []  # no script errors, no blocked or failed loads
    pixels = imread(shot)
    assert pixels.shape[:2] == (2000, 1280)
    ink = (pixels[..., :3].mean(axis=2) < 0.6).mean()
    assert ink > 0.01  # text, tables and plots, not a blank page
