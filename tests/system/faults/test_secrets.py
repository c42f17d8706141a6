"""Secrets never leave the machine, and names from configs or run ids never become paths outside the output
folder."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from anemoi_profiler import build_callbacks, wait_for_mlflow
from anemoi_profiler.tracking.sink import TrackingSink
from tests.helpers.mlflow_server import MlflowServer
from tests.system.faults.fault_helpers import only_run, only_run_folder, quick_config, seeded_fit
from tests.system.faults.fault_servers import ErrorServer

pytestmark = [pytest.mark.faults, pytest.mark.soak]  # a long suite: make soak (CI)

PASSWORD = "hunter2-planted-password"
PLANTED_ENV = {
    "HF_TOKEN": "hf_plantedHuggingFaceToken",
    "AWS_SECRET_ACCESS_KEY": "planted/aws+secret/access/key",
    "MLFLOW_TRACKING_PASSWORD": "planted-mlflow-password",
    "WANDB_API_KEY": "planted-wandb-api-key",
}
SECRETS = [PASSWORD, *PLANTED_ENV.values()]


def leaked_in(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def with_password(uri: str) -> str:
    return uri.replace("http://", f"http://alice:{PASSWORD}@")


@pytest.mark.slow
def test_planted_secrets_reach_no_artifact_param_tag_or_run_folder_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
    mlflow_server: MlflowServer,
) -> None:
    """A real run on a real `mlflow server`, reached through a URI with credentials, tokens in the environment."""
    for name, value in PLANTED_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", with_password(mlflow_server.uri))  # the profiler's own run goes here
    config = quick_config(tmp_path / "runs", "tracking.experiment=secrets", "report.console=true")
    with caplog.at_level(logging.INFO):
        seeded_fit(build_callbacks(config))
        wait_for_mlflow()  # and its lines with the run's link

    folder = only_run_folder(tmp_path / "runs")
    for path in folder.rglob("*"):  # config.yaml, environment.json, report.*, metrics.json, spool/run.json
        if path.is_file():
            assert not leaked_in(path.read_text(errors="replace")), path
    printed = capsys.readouterr()
    assert not leaked_in(printed.out + printed.err + caplog.text)

    client = MlflowClient(mlflow_server.uri)
    run = only_run(mlflow_server.uri, "secrets")
    assert run.info.status == "FINISHED" and run.info.end_time  # ended without MLflow printing its URL
    assert not leaked_in(json.dumps([run.data.params, run.data.tags, run.info.run_name]))
    downloaded = Path(client.download_artifacts(run.info.run_id, "profiler", str(tmp_path / "downloaded")))
    artifacts = [path for path in downloaded.rglob("*") if path.is_file()]
    assert {"config.yaml", "environment.json", "report.json", "report.txt"} <= {p.name for p in artifacts}
    for path in artifacts:
        assert not leaked_in(path.read_text(errors="replace")), path


def test_error_messages_that_quote_the_url_lose_its_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """MLflow's own errors quote the full URL, password included; the warnings the user sees must not."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with ErrorServer(500) as server, caplog.at_level(logging.WARNING):
        sink = TrackingSink(with_password(server.uri), "e", tmp_path / "run" / "spool" / "rank0")
        sink.log_metrics({"loss": 1.0}, step=1)
        sink.close("FINISHED", timeout_s=10)
    # the cause named, however MLflow gave up: urllib3's "too many 500 error responses" or MLflow's own
    # "failed with error code 500 != 200" (both seen with MLFLOW_HTTP_REQUEST_MAX_RETRIES=0)
    assert re.search(r"HTTP 500 (on every request|from the server)", caplog.text), caplog.text
    assert "alice:" not in caplog.text and not leaked_in(caplog.text)
    spool = tmp_path / "run" / "spool" / "rank0"
    assert {"run.json", "sender.json", "sender.log"} <= {path.name for path in spool.iterdir()}
    for path in spool.iterdir():  # the run, the sender's news and MLflow's own output
        assert PASSWORD not in path.read_text(), path.name


def test_run_and_experiment_names_that_look_like_paths_stay_names(
    tmp_path: Path, new_store: Callable[[Path], str]
) -> None:
    store = new_store(tmp_path / "store" / "mlflow.db")
    config = quick_config(
        tmp_path / "runs",
        f"tracking.uri={store}",
        "tracking.run_name=../../../escaped-run",
        "tracking.experiment=../../escaped-experiment",
    )
    seeded_fit(build_callbacks(config))

    assert not [path for path in tmp_path.parent.rglob("escaped*")]
    folder = only_run_folder(tmp_path / "runs")
    assert folder.parent == tmp_path / "runs"
    run = only_run(store, "../../escaped-experiment")
    assert run.info.run_name == "../../../escaped-run"
    artifacts = [a.path for a in MlflowClient(store).list_artifacts(run.info.run_id, "profiler")]
    assert artifacts and all(path.startswith("profiler/") and ".." not in path for path in artifacts)
    stored = {path.relative_to(tmp_path).parts[0] for path in tmp_path.rglob("*") if path.is_file()}
    assert stored == {"runs", "store"}
