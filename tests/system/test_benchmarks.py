"""The benchmark harness runs end to end; its timings are judged by the harness itself, not here.

`benchmarks/gpu_check.sh` with DRY_RUN=1 runs `benchmarks/run.py --quick --device cpu`, so one run of the
script checks both: the dry run exits 0, and the quick harness writes a JSON file with every section.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SECTIONS = (
    "overhead",
    "throughput_accuracy",
    "sink_cost",
    "trace_cost",
    "report_cost",
    "hta_scaling",
    "detailed_preset",
    "short_run",
    "window_end",
)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("gpu_check_out")
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out), "PYTHON": sys.executable, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    completed = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh")],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    return completed, out


@pytest.mark.slow
@pytest.mark.soak  # the whole quick harness on CPU: minutes
def test_gpu_check_dry_run_exits_0(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    completed, out = dry_run
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    assert (out / "run.log").is_file()
    assert "Targets" in completed.stdout  # the tables are printed last


@pytest.mark.slow
@pytest.mark.soak
def test_quick_harness_writes_every_section(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    out = dry_run[1]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    missing = [key for key in SECTIONS if key not in results]
    assert not missing, f"sections missing: {missing}"
    failed = {key: results[key]["note"] for key in SECTIONS if str(results[key].get("note", "")).startswith("failed")}
    assert not failed, failed

    configurations = results["overhead"]["configurations"]
    assert {"bare", "ours: always-on", "ours: simple preset", "ours: detailed preset"} <= set(configurations)
    assert {"Lightning ThroughputMonitor", "Lightning PyTorchProfiler"} <= set(configurations)
    assert configurations["bare"]["ratio_to_bare"]["median"] == pytest.approx(1.0)
    assert results["throughput_accuracy"]["runs"]
    for store in ("sqlite", "slow_server"):
        assert results["sink_cost"][store]["hooks"]["batches"] > 0, results["sink_cost"][store]
    assert results["sink_cost"]["slow_server"]["proxied_requests"] > 0
    assert results["trace_cost"]["ours"]["trace_gz_bytes"] > 0
    assert all(held > 0 for held in results["window_end"]["fits"]["ours"][0]["end_held_ms"])
    assert results["trace_cost"]["lightning"]["trace_json_bytes"] > 0
    assert results["report_cost"]["build_reports_s"] is not None
    assert results["hta_scaling"].get("runs") or results["hta_scaling"]["note"].startswith("skipped")
    assert results["detailed_preset"]["files"]["memory_report"] != "MISSING"
    for cost in (results["always_on_cost"]["shipped"], results["always_on_cost"]["busy"]):
        assert cost["bare_step_us"] > 0, cost
        assert cost["overhead_pct"] == pytest.approx(cost["training_thread_pct"] + cost["background_threads_pct"])
    assert "ratio_to_always_on" in results["overhead"]["outside_windows"]
    armed = results["overhead"]["triggers_armed"]
    assert set(armed) == {"wall_median", "wall_p10", "cpu_median", "cpu_p10"}
    assert all(value["ratio_to_simple"]["median"] > 0 and value["control_ratio"]["n"] >= 1 for value in armed.values())
    delivered = results["short_run"]["delivered"]
    assert delivered["status"] == "FINISHED" and delivered["metrics"] > 0, delivered
    assert delivered["absent"] == [] and delivered["spool_left"] is False, delivered
    assert results["short_run"]["fit"]["bare_s"] > 0 and results["short_run"]["script"]["bare_s"] > 0
    assert results["short_run"]["fit"]["delivery_after_fit_s"] >= 0
    script = results["short_run"]["script"]
    assert len(script["fit_runs_s"]["ours"]) == len(script["runs_s"]["bare"]) > 0
    statuses = {target["target"]: target["status"] for target in results["targets"]}
    assert set(statuses.values()) <= {"PASS", "FAIL", "SKIP", "NOISY"}
    assert statuses["always_on_cost_pct"] != "SKIP" and statuses["outside_windows_excess_pp"] != "SKIP"
    assert statuses["short_run_fit_extra_s"] != "SKIP" and statuses["short_run_script_extra_s"] != "SKIP"
    assert len(statuses) >= 8


# ---- the slow server's proxy, without MLflow ----


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_delaying_proxy_forwards_each_request_after_the_delay(
    echo_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from slow_proxy import DelayingProxy

    proxy = DelayingProxy(echo_server, delay_s=0.2).start()
    try:
        started = time.monotonic()
        request = urllib.request.Request(f"{proxy.uri}/api/echo", data=b"payload", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201
            assert response.read() == b"payload"
        assert time.monotonic() - started >= 0.2
        assert proxy.requests == 1
    finally:
        proxy.stop()
