"""The MLflow run page tells the story: searchable tags, `profiler.*` params and the diagnosis in the description,
for the profiler's own runs and the user's MLFlowLogger runs, on real sqlite stores and real CPU fits."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import mlflow
import pytest
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH
from torch.utils.data import DataLoader

from anemoi_profiler import ProfilerConfig, build_callbacks, names, wait_for_mlflow
from anemoi_profiler.cli.main import main
from anemoi_profiler.reports.description import run_description
from anemoi_profiler.reports.diagnosis import Verdict, assess
from anemoi_profiler.reports.run_data import load_run
from anemoi_profiler.run_files.layout import run_folders
from anemoi_profiler.tracking.mlflow_target import CUT_NOTE, MAX_TAG_VALUE_CHARS, SECTION_END, SECTION_START
from anemoi_profiler.tracking.sink import TrackingSink
from anemoi_profiler.tracking.spool import pending_batches
from tests.helpers.lightning_models import SlowSamples, TinyRegressor, loaders, trainer

DESCRIPTION = "mlflow.note.content"
USERS_NOTES = "## My experiment\n\nBaseline with the *new* tokenizer; compare with last week's run."


def profiler_config(output_dir: Path, *overrides: str) -> ProfilerConfig:
    return ProfilerConfig.load(
        None,
        [f"output_dir={output_dir}", "report.console=false", "system.enabled=false", "log_every_n_steps=6",
         "throughput.warmup_steps=2", *overrides],
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fit with a sleeping dataloader, then a compute-bound one, in the embedded store of their output folder
    (no logger: the profiler's own runs)."""
    output = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: the per-test isolation has not run yet
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # an earlier test's MLFlowLogger may have set it
        trainer(build_callbacks(profiler_config(output)), limit_val_batches=0).fit(
            TinyRegressor(), DataLoader(SlowSamples(), batch_size=16)
        )
        train, _ = loaders(n_train=384)
        fit = trainer(build_callbacks(profiler_config(output)), limit_val_batches=0)
        fit.fit(TinyRegressor(step_sleep_s=0.04), train)
    assert wait_for_mlflow()
    return output


def search(uri: str, filter_string: str) -> list[str]:
    """Run names (= run folder names) of the runs that `mlflow.search_runs` finds."""
    mlflow.set_tracking_uri(uri)
    try:
        runs = mlflow.search_runs(
            experiment_names=["anemoi-profiler"], filter_string=filter_string, output_format="list"
        )
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # MLflow's way to unset it
    return sorted(run.info.run_name for run in runs)


def test_runs_are_found_by_verdict_and_by_device(two_runs: Path) -> None:
    output = two_runs
    slow, compute = (folder.name for folder in run_folders(output))
    uri = f"sqlite:///{output / 'mlflow.db'}"
    assert search(uri, "tags.`profiler.verdict` LIKE '%dataloader-bound%'") == [slow]
    assert search(uri, "tags.`profiler.verdict` = 'none'") == [compute]
    assert search(uri, "tags.`profiler.device` = 'cpu'") == sorted([slow, compute])
    assert search(uri, "tags.`profiler.device` = 'NVIDIA H200'") == []
    assert search(uri, "tags.`profiler.world_size` = '1' and params.`profiler.log_every_n_steps` = '6'") == sorted(
        [slow, compute]
    )


def test_the_description_holds_the_diagnosis_and_where_the_report_is(two_runs: Path) -> None:
    output = two_runs
    client = MlflowClient(f"sqlite:///{output / 'mlflow.db'}")
    slow_folder = run_folders(output)[0]
    experiment_id = client.get_experiment_by_name("anemoi-profiler").experiment_id
    (run,) = client.search_runs([experiment_id], f"tags.`profiler.run_folder` = '{slow_folder}'")
    description = run.data.tags[DESCRIPTION]
    assert description.startswith(SECTION_START) and description.endswith(SECTION_END)  # no user text to keep
    verdict = assess(load_run(slow_folder))["dataloader wait"]
    assert isinstance(verdict, Verdict) and verdict.severity == "high"
    assert f"**dataloader-bound** (high): {verdict.value}." in description
    assert "*Next:* Raise the DataLoader's num\\_workers" in description
    assert "training step **" in description and "dataloader wait **" in description
    assert "`profiler/report.html` in the run's Artifacts" in description
    assert "profiler/report.html" in {a.path for a in client.list_artifacts(run.info.run_id, "profiler")}


def test_tags_and_params_say_what_ran(two_runs: Path) -> None:
    output = two_runs
    folder = run_folders(output)[0]
    client = MlflowClient(f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("anemoi-profiler")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the profiler created it
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`profiler.run_folder` = '{folder}'")
    environment = json.loads((folder / "environment.json").read_text())
    tags = run.data.tags
    assert {key: tags[key] for key in ("profiler.device", "profiler.device_count", "profiler.world_size",
                                       "profiler.nodes", "profiler.strategy", "profiler.precision")} == {
        "profiler.device": "cpu", "profiler.device_count": "1", "profiler.world_size": "1", "profiler.nodes": "1",
        "profiler.strategy": "SingleDeviceStrategy", "profiler.precision": "32-true",
    }  # fmt: skip
    assert tags["profiler.version"] == environment["packages"]["anemoi-profiler"]
    assert tags["profiler.torch"] == environment["packages"]["torch"]
    assert tags["profiler.lightning"] == environment["packages"]["lightning"]
    assert not [key for key in tags if key.startswith("anemoi_profiler.")]  # the old scheme is gone
    params = run.data.params
    assert params["profiler.config_hash"] == folder.name.rsplit("_", 1)[1]
    assert params["profiler.run_folder"] == str(folder)
    assert params["profiler.throughput.warmup_steps"] == "2" and params["profiler.profiler.enabled"] == "false"
    assert params["profiler.profiler.train.active"] == "3"
    assert params["profiler.distributed.profiled_ranks"] == "auto"
    assert not [key for key in params if key.startswith(("profiler.tracking.", "profiler.report.", "profiler/"))]
    assert all(len(value) <= 6000 for value in params.values())


def test_the_commit_and_the_run_link_of_the_embedded_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fit in a git checkout (the working folder) tags the run with its commit, and prints the run's link."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the user's code"], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    train, _ = loaders(n_train=32)
    trainer(build_callbacks(profiler_config(tmp_path / "runs"))).fit(TinyRegressor(), train)
    wait_for_mlflow()
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("anemoi-profiler")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["mlflow.source.git.commit"] == commit
    printed = capsys.readouterr().out
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'runs' / 'mlflow.db'}" in printed
    link = f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
    assert f"then go to {link}?workflowType=machine_learning" in printed


def test_the_users_description_is_kept_and_our_section_replaced_when_the_run_resumes(
    tmp_path: Path, sqlite_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    logger = MLFlowLogger(experiment_name="users", tracking_uri=sqlite_uri, tags={DESCRIPTION: USERS_NOTES})
    train, _ = loaders(n_train=96)
    trainer(build_callbacks(profiler_config(tmp_path / "runs")), logger=logger).fit(TinyRegressor(), train)
    wait_for_mlflow()
    client = MlflowClient(sqlite_uri)
    first = client.get_run(logger.run_id).data.tags[DESCRIPTION]
    assert first.startswith(USERS_NOTES + "\n\n" + SECTION_START + "\n") and first.endswith(SECTION_END)
    assert "mlflow.experimentKind" not in client.get_experiment_by_name("users").tags  # never on the user's

    # The same run resumed with another config: a new run folder, another log interval.
    resumed = MLFlowLogger(experiment_name="users", tracking_uri=sqlite_uri, run_id=logger.run_id)
    caplog.set_level(logging.WARNING)
    callbacks = build_callbacks(profiler_config(tmp_path / "runs", "log_every_n_steps=3"))
    trainer(callbacks, logger=resumed).fit(TinyRegressor(), train)
    wait_for_mlflow()
    run = client.get_run(logger.run_id)
    second_folder = callbacks[0].session.run_dir  # both folders may carry the same second in their names
    assert second_folder is not None and len(run_folders(tmp_path / "runs")) == 2
    second = load_run(second_folder)
    section = run_description(second, assess(second), "`profiler/report.html` in the run's Artifacts")
    assert run.data.tags[DESCRIPTION] == f"{USERS_NOTES}\n\n{SECTION_START}\n{section}\n{SECTION_END}"
    clashes = [r.getMessage() for r in caplog.records if "already has param(s)" in r.getMessage()]
    assert len(clashes) == 1, clashes
    assert "profiler.log_every_n_steps, profiler.run_folder" in clashes[0]
    assert run.data.params["profiler.log_every_n_steps"] == "6"  # MLflow keeps a param's first value
    assert run.data.tags["profiler.run_folder"] == str(second_folder)  # tags follow the latest fit
    assert run.info.status == "FINISHED"


def test_a_run_that_crashes_is_tagged_and_described_as_such(tmp_path: Path, sqlite_uri: str) -> None:
    logger = MLFlowLogger(experiment_name="users", tracking_uri=sqlite_uri)
    train, _ = loaders(n_train=96)
    with pytest.raises(RuntimeError, match="boom"):
        trainer(build_callbacks(profiler_config(tmp_path / "runs")), logger=logger).fit(
            TinyRegressor(fail_at_step=4), train
        )
    wait_for_mlflow()
    tags = MlflowClient(sqlite_uri).get_run(logger.run_id).data.tags
    assert tags["profiler.device"] == "cpu" and tags["profiler.run_folder"] == str(run_folders(tmp_path / "runs")[0])
    assert tags["profiler.verdict"] == "not-assessed"  # 4 batches, 2 of them warmup: no log interval to judge
    assert "The run ended **FAILED**" in tags[DESCRIPTION]


def users_run(uri: str, notes: str) -> str:
    client = MlflowClient(uri)
    return client.create_run(client.create_experiment("users"), tags={DESCRIPTION: notes}).info.run_id


def describe(uri: str, run_id: str, spool: Path, section: str) -> str:
    """Send `section` through a sink and its sender process, as at the end of a fit; the description after."""
    sink = TrackingSink(uri, "users", spool, run_id=run_id, flush_interval_s=0.1)
    sink.set_description(section)
    assert sink.close(timeout_s=60)
    return MlflowClient(uri).get_run(run_id).data.tags[DESCRIPTION]


def test_mlflows_own_git_commit_of_the_users_run_is_kept(tmp_path: Path, sqlite_uri: str) -> None:
    client = MlflowClient(sqlite_uri)
    experiment_id = client.create_experiment("users")
    run_id = client.create_run(experiment_id, tags={"mlflow.source.git.commit": "theirs"}).info.run_id
    sink = TrackingSink(sqlite_uri, "users", tmp_path / "spool", run_id=run_id, flush_interval_s=0.1)
    sink.set_tags({"mlflow.source.git.commit": "ours", "profiler.device": "cpu"})
    assert sink.close(timeout_s=60)
    tags = client.get_run(run_id).data.tags
    assert (tags["mlflow.source.git.commit"], tags["profiler.device"]) == ("theirs", "cpu")


def test_our_section_is_cut_to_mlflows_limit_never_the_users_text(tmp_path: Path, sqlite_uri: str) -> None:
    assert MAX_TAG_VALUE_CHARS <= MAX_TAG_VAL_LENGTH  # the limit we fit into holds for this MLflow (2.x: 5,000)
    notes = "user notes line\n" * 200  # 3,200 characters
    run_id = users_run(sqlite_uri, notes)
    section = "\n".join(f"- verdict line {i}: " + "x" * 60 for i in range(40))  # about 3,000 characters
    description = describe(sqlite_uri, run_id, tmp_path / "spool", section)
    assert len(description) <= MAX_TAG_VALUE_CHARS
    opening = notes + "\n" + SECTION_START + "\n"  # a blank line between their text and ours
    assert description.startswith(opening + "- verdict line 0: ")
    assert description.endswith(CUT_NOTE + "\n" + SECTION_END)
    kept = description.removeprefix(opening).removesuffix(CUT_NOTE + "\n" + SECTION_END)
    assert kept.splitlines() == section.splitlines()[: len(kept.splitlines())]  # whole lines only
    assert describe(sqlite_uri, run_id, tmp_path / "spool", section) == description  # idempotent


def test_a_description_with_no_room_left_is_not_touched(
    tmp_path: Path, sqlite_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    notes = "n" * (MAX_TAG_VAL_LENGTH - 100)
    run_id = users_run(sqlite_uri, notes)
    caplog.set_level(logging.WARNING)
    section = "- **dataloader-bound** (high): 75% of training step time waits for data " + "x" * 200
    assert describe(sqlite_uri, run_id, tmp_path / "spool", section) == notes
    assert any("leaves no room for the diagnosis" in r.getMessage() for r in caplog.records)


def test_sync_sends_a_spool_written_by_0_1_0(tmp_path: Path, sqlite_uri: str) -> None:
    """Spool files of the previous version have no `description`; `sync` still sends every record."""
    folder = tmp_path / "20250101-120000_1a2b3c4d"
    spool = folder / "spool" / "rank0"
    spool.mkdir(parents=True)
    (spool / "run.json").write_text(
        json.dumps({"tracking_uri": sqlite_uri, "experiment": "anemoi-profiler", "run_id": None,
                    "run_name": folder.name, "tags": {"anemoi_profiler.run_folder": str(folder)}})
    )  # fmt: skip
    (spool / "batch-00000001700000000000-000000.json").write_text(
        json.dumps({"metrics": [[names.TRAIN_STEP_MS, 7.5, 1700000000000, 10]],
                    "params": {"profiler/config_hash": "1a2b3c4d"}, "tags": {}, "artifacts": [],
                    "terminate": "FINISHED"})
    )  # fmt: skip
    assert main(["sync", str(folder)]) == 0
    assert not pending_batches(spool)
    client = MlflowClient(sqlite_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.data.metrics == {names.TRAIN_STEP_MS: 7.5} and run.data.params == {"profiler/config_hash": "1a2b3c4d"}
    assert run.data.tags["anemoi_profiler.run_folder"] == str(folder) and run.info.status == "FINISHED"
    assert DESCRIPTION not in run.data.tags
