"""Triggered profiling windows in real CPU fits: a run that becomes slower gets a `drift` window right after,
laid out as scheduled windows are, and listed with its evidence in windows.json; a steady run gets none."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.cli.main import main
from anemoi_profiler.cli.request_command import CONFIG_WAIT_S
from anemoi_profiler.profiling.traces import read_trace
from anemoi_profiler.reports.description import run_description
from anemoi_profiler.reports.diagnosis import assess
from anemoi_profiler.reports.plots import window_marks
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.layout import (
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    REQUEST_FILE,
    WINDOWS_FILE,
    run_folders,
    spool_dirs,
    trace_path,
)
from anemoi_profiler.run_files.steps_file import PROFILED, read_steps
from anemoi_profiler.tracking.spool import read_run_info
from anemoi_profiler.triggers.requests import read_request
from tests.helpers.jobs import (
    JOB_TIMEOUT_S,
    finish_job,
    free_port,
    job_command,
    only_run,
    only_run_folder,
    run_jobs,
    run_ok,
    start_job,
    trace_ranks,
)
from tests.helpers.lightning_models import TinyRegressor, loaders

REQUEST_RANKS_JOB = Path(__file__).resolve().parents[1] / "helpers" / "request_ranks_job.py"
LOG_EVERY = 20


class PacedModel(TinyRegressor):
    """Starts its training steps on a metronome: one every `period_s`, `slowdown` times as far apart from optimizer
    step `slow_from` on. Whatever else a shared machine runs, the step time is the period (a step's own work, a
    few ms, fits in it, and a late start is made up by the next), so the detectors see a change only where the
    test makes one."""

    def __init__(self, slow_from: int | None, slowdown: float = 1.3, period_s: float = 0.03) -> None:
        super().__init__()
        self.slow_from = slow_from
        self.slowdown = slowdown
        self.period_s = period_s
        self.beat: float | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        slower = self.slow_from is not None and self.global_step >= self.slow_from
        now = time.perf_counter()
        self.beat = now if self.beat is None else self.beat + self.period_s * (self.slowdown if slower else 1.0)
        time.sleep(max(0.0, self.beat - now))
        return super().training_step(batch, batch_idx)


class GrowingModel(TinyRegressor):
    """Keeps a 4 MB tensor from every training step, as code that holds on to its outputs does: RSS climbs."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.kept.append(torch.ones(1024 * 1024))  # written, so resident
        return super().training_step(batch, batch_idx)


def triggered_fit(
    tmp_path: Path, model: pl.LightningModule, steps: int, *overrides: str, accumulate_grad_batches: int = 1
) -> Path:
    config = ProfilerConfig.load(
        None,
        [
            f"output_dir={tmp_path}",
            "system.enabled=false",
            "tracking.enabled=false",
            "report.console=false",
            f"log_every_n_steps={LOG_EVERY}",
            "throughput.warmup_steps=2",
            "triggers.enabled=true",
            "triggers.warmup_intervals=1",
            *overrides,
        ],
    )
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate_grad_batches,
        callbacks=build_callbacks(config),
    )
    trainer.fit(model, loaders(n_train=steps * accumulate_grad_batches * 16)[0])
    (run_dir,) = run_folders(tmp_path)
    return run_dir


def windows(run_dir: Path) -> list[dict[str, Any]]:
    return json.loads((run_dir / WINDOWS_FILE).read_text())["windows"]


def test_a_run_that_becomes_30_percent_slower_gets_a_drift_window_right_after(tmp_path: Path) -> None:
    slow_from = 140
    run_dir = triggered_fit(tmp_path, PacedModel(slow_from), 220)

    (window,) = windows(run_dir)
    assert window["reason"] == "drift" and window["stage"] == "train" and window["ranks"] == [0]
    # caught within 2 log intervals of the change: decided at the end of the second slower interval at the latest
    assert slow_from < window["decided_at_step"] <= slow_from + 2 * LOG_EVERY + 2
    assert window["start_batch"] == window["decided_at_step"] + 1  # the next batch is the profiler's warmup
    assert window["start_step"] == window["start_batch"]  # one optimizer step per batch
    evidence = window["evidence"]
    assert evidence["value"] > evidence["threshold"] > evidence["baseline_median"]
    # the least of the confirming intervals: the first may straddle the change
    assert 1.05 < evidence["value"] / evidence["baseline_median"] < 1.45
    trace = read_trace(trace_path(run_dir, "train", window["window"], 0))
    assert trace["distributedInfo"]["rank"] == 0
    steps = {e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) == 3
    report = json.loads((run_dir / "report.json").read_text())["sections"]["Profiling windows"]
    assert report["rows"][0][5] == "drift"
    run = load_run(run_dir)
    description = run_description(run, assess(run), "report.html")
    assert f"train window {window['window']} (drift) at batch {window['start_batch']} on ranks 0" in description
    assert window["memory_snapshot"] is None
    # the step-time plot, in plots/ and embedded in report.html, marks the window where it starts
    plot = (run_dir / "plots/step_time.svg").read_text()
    assert f">window {window['window']}: drift</text>" in plot
    assert base64.b64encode(plot.encode()).decode() in (run_dir / "report.html").read_text()


def test_window_marks_sit_on_the_optimizer_step_with_gradient_accumulation(tmp_path: Path) -> None:
    """Two batches per optimizer step: the plot's axis counts steps, so a window starting at batch b is marked at
    step b // 2, inside the plotted steps (at b it would sit past the end of the run)."""
    slow_from = 70  # optimizer steps: batch 140
    run_dir = triggered_fit(tmp_path, PacedModel(slow_from), 110, accumulate_grad_batches=2)

    (window,) = windows(run_dir)
    assert window["reason"] == "drift"
    assert window["start_step"] == window["start_batch"] // 2 > slow_from
    steps, _ = load_run(run_dir).series(names.TRAIN_STEP_MS)
    assert steps[0] < window["start_step"] < steps[-1] <= 110 < window["start_batch"]
    assert window_marks(load_run(run_dir)) == [(window["start_step"], f"window {window['window']}: drift")]


def test_a_fit_whose_memory_climbs_gets_a_memory_window_not_assessed_on_cpu(tmp_path: Path) -> None:
    # 1 %: 100 MB is 5 % of this process only while it holds under 2 GB, less late in a whole test session
    overrides = ["log_every_n_steps=5", "triggers.drift=false", "triggers.requests=false"]
    run_dir = triggered_fit(tmp_path, GrowingModel(), 60, *overrides, "triggers.min_memory_growth=0.01")

    (window,) = windows(run_dir)
    assert window["reason"] == "memory" and window["ranks"] == [0]
    evidence = window["evidence"]
    assert evidence["statistic"].startswith("peak memory (MB) after 5 rising intervals")
    # RSS (no GPU): 5 intervals of 5 steps, 4 MB kept per step
    assert evidence["value"] - evidence["baseline_median"] >= 0.8 * 5 * 5 * 4
    assert evidence["value"] > evidence["threshold"] >= 1.01 * evidence["baseline_median"]
    assert window["memory_snapshot"] == "not assessed: a CUDA memory snapshot needs a CUDA device, this run is on cpu"
    assert trace_path(run_dir, "train", window["window"], 0).is_file()
    report = json.loads((run_dir / "report.json").read_text())["sections"]["Profiling windows"]
    assert report["rows"][0][5] == "memory" and report["rows"][0][-1] == window["memory_snapshot"]


@pytest.mark.slow
@pytest.mark.soak
def test_a_steady_run_of_2000_steps_gets_no_triggered_window(tmp_path: Path) -> None:
    run_dir = triggered_fit(tmp_path, PacedModel(None), 2000, "log_every_n_steps=50")
    assert windows(run_dir) == []
    assert not (run_dir / "traces").exists()


@pytest.mark.slow
def test_a_rank_that_starts_to_lag_gets_a_slow_rank_window_on_it_and_rank_0(tmp_path: Path) -> None:
    output_dir = tmp_path / "runs"
    output_dir.mkdir()
    flags = ["--devices=2", f"--output-dir={output_dir}", "--max-steps=110", "--batch-size=8"]
    # every step waits 30 ms off the CPU, as a GPU step does: a busy machine's scheduling noise is a small share of it
    lagging = ["--step-ms=30", "--slow-rank=1", "--slow-ms=30", "--slow-from-step=60"]
    overrides = ["log_every_n_steps=8", "throughput.warmup_steps=2", "system.enabled=false", "report.console=false"]
    # drift off: 8-step intervals on a busy machine vary too much to say which trigger fires first; with traces
    # kept only where flagged, the ranks a triggered window was opened for keep theirs
    triggers = ["triggers.enabled=true", "triggers.warmup_intervals=1", "triggers.drift=false"]
    triggers.append("profiler.traces=flagged")
    run_ok(job_command(*flags, *lagging, *overrides, *triggers), tmp_path)
    run_dir = only_run_folder(output_dir)

    (window,) = windows(run_dir)
    assert window["reason"] == "slow-rank" and window["ranks"] == [0, 1]
    assert 60 < window["decided_at_step"] <= 60 + 2 * 8 + 2
    assert trace_ranks(run_dir) == {f"train/window_{window['window']}": [0, 1]}
    assert window["evidence"]["value"] > window["evidence"]["threshold"]


def test_a_request_on_a_running_fit_gets_its_window_and_is_answered(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    new_store(tmp_path / "mlflow.db")  # the request and the fit's sender open it at once: neither migrates it
    answers: list[int] = []

    def request_when_running() -> None:
        deadline = time.monotonic() + 60
        while not run_folders(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # well into training
        folder = str(run_folders(tmp_path)[0])
        answers.append(main(["request", folder, "--steps=2", "--ranks=0", "--memory", "--wait=30"]))

    requester = threading.Thread(target=request_when_running)
    requester.start()
    overrides = [
        "triggers.request_poll_s=0.2",
        "triggers.drift=false",
        "triggers.memory=false",
        "tracking.enabled=true",
    ]
    run_dir = triggered_fit(tmp_path, PacedModel(None), 300, *overrides)
    requester.join()

    assert answers == [0]
    (window,) = windows(run_dir)
    assert window["reason"] == "request" and window["steps"] == 2 and window["ranks"] == [0]
    # served on CPU all the same; the snapshot it asked for is not assessed here
    assert window["memory_snapshot"].startswith("not assessed: a CUDA memory snapshot needs a CUDA device")
    request = json.loads((run_dir / REQUEST_FILE).read_text())
    assert request["id"] == window["request"]
    assert (request["served_window"], request["served_at_step"]) == (window["window"], window["start_batch"])
    trace = read_trace(trace_path(run_dir, "train", window["window"], 0))
    steps = sorted(e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == [f"ProfilerStep#{window['start_batch']}", f"ProfilerStep#{window['start_batch'] + 1}"]
    assert wait_for_mlflow()  # an in-process fit's run is sent in the background after the fit
    mlflow_run = only_run(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert mlflow_run.data.tags["profiler.triggers"] == "armed: requests; triggered windows left: 3"
    assert f"train window {window['window']} (request)" in mlflow_run.data.tags["mlflow.note.content"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--steps=0"], "--steps: got 0"), (["--ranks=0,x"], "--ranks: got '0,x'"), (["--ranks=-1"], "--ranks: got [-1]")],
)
def test_request_refuses_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    (tmp_path / CONFIG_FILE).write_text("{}\n")
    assert main(["request", str(tmp_path), *arguments]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / REQUEST_FILE).exists()


def test_request_refuses_ranks_the_job_does_not_have(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / CONFIG_FILE).write_text("{}\n")
    (tmp_path / ENVIRONMENT_FILE).write_text(json.dumps({"world_size": 1200}))
    assert main(["request", str(tmp_path), "--ranks=0,1200"]) == 1
    assert "--ranks: got [0, 1200], the job has 1200 ranks (0 to 1199)" in capsys.readouterr().err
    assert main(["request", str(tmp_path), "--ranks=0,777,1199"]) == 0
    assert read_request(tmp_path).ranks == [0, 777, 1199]


def test_a_request_names_any_rank_of_a_large_job_without_growing_the_exchange(tmp_path: Path) -> None:
    """Rank 0 broadcasts the named ranks once, on the profiler's real gloo group; the interval exchange carries
    only how many (the first three processes of a 1,200-rank job: see the helper)."""
    port = str(free_port())
    jobs = [[sys.executable, str(REQUEST_RANKS_JOB), str(rank), port, "1200", str(tmp_path)] for rank in range(3)]
    for returncode, output in run_jobs(jobs, tmp_path):
        assert returncode == 0, output[-3000:]


@pytest.mark.slow
def test_a_request_for_rank_1_of_a_ddp_job_is_recorded_there_alone(tmp_path: Path) -> None:
    """The named ranks reach every rank of a real 2-rank DDP fit: only rank 1 records, rank 0 lists the window."""
    output_dir = tmp_path / "runs"
    output_dir.mkdir()
    flags = ["--devices=2", f"--output-dir={output_dir}", "--max-steps=600", "--slow-rank=1", "--slow-ms=20"]
    overrides = ["log_every_n_steps=10", "throughput.warmup_steps=2", "system.enabled=false", "report.console=false"]
    triggers = ["triggers.enabled=true", "triggers.request_poll_s=0.2", "triggers.drift=false"]
    triggers += ["triggers.slow_rank=false", "triggers.memory=false"]
    job = start_job(job_command(*flags, *overrides, *triggers), tmp_path)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    # as soon as the run folder appears: `request` waits the moment until its config copy is written
    while not run_folders(output_dir):
        if time.monotonic() > deadline or job.poll() is not None:
            break
        time.sleep(0.2)
    folders = run_folders(output_dir)
    answer = main(["request", str(folders[0]), "--steps=2", "--ranks=1", "--wait=60"]) if folders else None
    returncode, output = finish_job(job, deadline)

    assert returncode == 0 and answer == 0, output[-6000:]
    run_dir = only_run_folder(output_dir)
    (window,) = windows(run_dir)
    assert window["reason"] == "request" and window["ranks"] == [1] and window["steps"] == 2
    assert trace_ranks(run_dir) == {f"train/window_{window['window']}": [1]}
    # Rank 0 waits for rank 1's window in each step's all-reduce: its warmup and recorded steps are not steady there.
    flags = read_steps(run_dir)["train"].flags
    flagged = [batch for batch, flag in enumerate(flags) if flag & PROFILED]
    recorded = list(range(window["start_batch"], window["start_batch"] + window["steps"]))
    assert flagged == list(range(flagged[0], recorded[-1] + 1)) and flagged[-len(recorded) :] == recorded, flagged


def test_request_refuses_a_folder_that_is_no_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["request", str(tmp_path)]) == 1
    assert "is not a run folder" in capsys.readouterr().err


def test_request_waits_for_a_new_run_folders_config_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder named as a run folder gets its config copy a moment after it appears: `request` waits for it (up
    to `CONFIG_WAIT_S`), and refuses one that never gets it."""
    run_dir = tmp_path / "20261207-120000_0123abcd"
    run_dir.mkdir()
    writer = threading.Timer(0.5, (run_dir / CONFIG_FILE).write_text, args=("{}\n",))
    writer.start()
    assert main(["request", str(run_dir), "--steps=2"]) == 0
    writer.join()
    assert read_request(run_dir).steps == 2

    empty = tmp_path / "20261207-120001_0123abcd"
    empty.mkdir()
    started = time.monotonic()
    assert main(["request", str(empty)]) == 1
    assert time.monotonic() - started >= CONFIG_WAIT_S
    assert f"{empty} is not a run folder (no {CONFIG_FILE})" in capsys.readouterr().err
    assert not (empty / REQUEST_FILE).exists()


@pytest.mark.slow
def test_a_rank_dying_inside_a_triggered_window_ends_the_job_without_a_hang(tmp_path: Path) -> None:
    output_dir = tmp_path / "runs"
    output_dir.mkdir()
    flags = ["--devices=2", f"--output-dir={output_dir}", "--max-steps=120", "--batch-size=8"]
    # rank 1 lags from step 30 (a window of 40 steps opens by step 40) and raises at step 60, inside it; every step
    # waits 30 ms off the CPU, as a GPU step does, so that a busy machine's noise does not hide the lag
    faults = ["--step-ms=30", "--slow-rank=1", "--slow-ms=30", "--slow-from-step=30"]
    faults += ["--fail-on-rank=1", "--fail-at-step=60"]
    overrides = ["log_every_n_steps=4", "throughput.warmup_steps=2", "system.enabled=false", "report.console=false"]
    triggers = ["triggers.enabled=true", "triggers.warmup_intervals=1", "triggers.drift=false", "triggers.steps=40"]
    started = time.monotonic()
    command = job_command(*flags, *faults, *overrides, *triggers, "distributed.timeout_s=20")
    [(returncode, output)] = run_jobs([command], tmp_path)

    assert returncode != 0 and "injected failure on rank 1" in output, output[-6000:]
    assert time.monotonic() - started < JOB_TIMEOUT_S - 30, output[-6000:]
    (window,) = windows(only_run_folder(output_dir))
    assert window["reason"] == "slow-rank" and window["start_batch"] < 60 < window["start_batch"] + 40


@pytest.mark.slow
def test_a_request_through_the_mlflow_run_tag_gets_its_window(tmp_path: Path) -> None:
    """The laptop's way: only the tracking server is shared; the job's MLflow sender relays the tag."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    answers: list[int] = []

    def request_through_mlflow() -> None:
        deadline = time.monotonic() + 60
        run_id = None
        while run_id is None and time.monotonic() < deadline:  # the job's run id, once its sender created the run
            time.sleep(0.5)
            with contextlib.suppress(OSError, ValueError, IndexError):
                run_id = read_run_info(spool_dirs(run_folders(tmp_path)[0])[0]).get("run_id")
        answers.append(main(["request", str(run_id), f"--tracking-uri={uri}", "--steps=2", "--wait=40"]))

    requester = threading.Thread(target=request_through_mlflow)
    requester.start()
    overrides = [
        "triggers.request_poll_s=0.2",
        "triggers.drift=false",
        "triggers.memory=false",
        "tracking.enabled=true",
    ]
    # the test's client and the job share one sqlite file: a send that finds it locked is retried a second later
    sending = ["tracking.flush_interval_s=1", "tracking.retry_interval_s=1"]
    run_dir = triggered_fit(tmp_path, PacedModel(None), 900, *overrides, *sending)
    requester.join()

    assert answers == [0]
    (window,) = windows(run_dir)
    assert window["reason"] == "request" and window["steps"] == 2
    served = json.loads(only_run(uri).data.tags["profiler.request_served"])
    assert (served["id"], served["window"], served["batch"]) == (
        window["request"],
        window["window"],
        window["start_batch"],
    )
