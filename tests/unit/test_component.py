"""Component profiling: a LayerNorm outside a Trainer, from Python, the CLI entry and a YAML file."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from anemoi_profiler import ConfigError, ProfilerConfig, names
from anemoi_profiler.cli import component_command
from anemoi_profiler.component import profile_component
from anemoi_profiler.profiling.traces import read_trace
from anemoi_profiler.run_files.layout import run_folders

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORT_WINDOWS = [
    "profiler.train.skip_first=1",
    "profiler.train.wait=0",
    "profiler.train.warmup=1",
    "profiler.train.active=2",
    "profiler.train.repeat=2",
]


def config_for(output_dir: Path, *overrides: str) -> ProfilerConfig:
    return ProfilerConfig.load(
        None, [f"output_dir={output_dir}", "tracking.enabled=false", "report.console=false", *SHORT_WINDOWS, *overrides]
    )


def operators(run_dir: Path) -> set[str]:
    report = json.loads((run_dir / "time_report.json").read_text())
    return {op["operator"] for window in report["windows"] for op in window["operators"]}


def test_layer_norm_end_to_end(tmp_path: Path) -> None:
    run_dir = profile_component(
        torch.nn.LayerNorm(256), input_shapes=[(16, 256)], config=config_for(tmp_path), backward=True
    )
    assert run_dir.parent == tmp_path
    traces = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "traces").rglob("*") if p.is_file())
    assert traces == [
        "traces/component/window_0/rank0.pt.trace.json.gz",
        "traces/component/window_1/rank0.pt.trace.json.gz",
    ]
    trace = read_trace(run_dir / "traces/component/window_1/rank0.pt.trace.json.gz")
    assert trace["distributedInfo"]["rank"] == 0
    steps = sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#5", "ProfilerStep#6"]  # skip 1, then (warmup 1, active 2) x 2
    assert {"aten::layer_norm", "aten::native_layer_norm", "aten::native_layer_norm_backward"} <= operators(run_dir)
    assert "Negative values are frees" in (run_dir / "memory_report.txt").read_text()
    for name in ("config.yaml", "environment.json", "memory_report.csv", "memory_report.json", "time_report.csv"):
        assert (run_dir / name).is_file(), name
    report = json.loads((run_dir / "report.json").read_text())
    assert report["header"]["target"] == "LayerNorm"
    assert report["header"]["inputs"] == "(16, 256) float32"
    assert report["sections"]["Component"]["data"]["steps"] == 7
    assert report["sections"]["Torch profiler"]["data"]["component windows"] == 2
    summary = json.loads((run_dir / "window_summaries/component/window_1/window_summary.json").read_text())
    assert [rank["steps"] for rank in summary["ranks"]] == [2.0]  # the window summary, as in a fit


def test_a_plain_function_in_bfloat16_forward_only(tmp_path: Path) -> None:
    def gelu_of_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(a + b)

    run_dir = profile_component(
        gelu_of_sum, input_shapes=[(4, 64), (4, 64)], dtype="bfloat16", config=config_for(tmp_path)
    )
    assert {"aten::add", "aten::gelu"} <= operators(run_dir)
    assert "backward" not in " ".join(operators(run_dir))
    assert json.loads((run_dir / "report.json").read_text())["header"]["inputs"] == "(4, 64) bfloat16, (4, 64) bfloat16"


def test_compiled_layer_norm(tmp_path: Path) -> None:
    """torch.compile on CPU; aot_eager keeps it to seconds (inductor takes ~45 s cold on this CPU)."""
    run_dir = profile_component(
        torch.nn.LayerNorm(64),
        input_shapes=[(8, 64)],
        config=config_for(tmp_path),
        compile="aot_eager",
        backward=True,
    )
    report = json.loads((run_dir / "report.json").read_text())
    assert report["header"]["compile"] == "aot_eager"
    assert "CompiledFunction" in operators(run_dir) or any("Torch-Compiled" in op for op in operators(run_dir))
    assert report["sections"]["Component"]["data"]["first call (compiles, warms caches)"] > 0


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    component_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_with_the_example_yaml(tmp_path: Path) -> None:
    args = parse(
        "--config",
        str(EXAMPLES / "component.yaml"),
        "--input-shape",
        "4,32,1024",
        "--output-dir",
        str(tmp_path),
        "report.console=false",
        *SHORT_WINDOWS,
    )
    assert component_command.run(args) == 0
    (run_dir,) = tmp_path.iterdir()
    header = json.loads((run_dir / "report.json").read_text())["header"]
    assert header["target"] == "LayerNorm"  # from the YAML: component_profiling.py:layer_norm next to it
    assert header["inputs"] == "(4, 32, 1024) float32"  # the flag replaced the YAML's inputs
    assert header["backward"] is True  # from the YAML
    assert "aten::native_layer_norm_backward" in operators(run_dir)


def test_cli_target_and_mlflow_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_store: Callable[[Path], str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps artifacts in ./mlruns
    uri = new_store(tmp_path / "mlflow.db")  # migrated already: a short job's sender need not migrate it
    args = parse(
        "--target",
        f"{EXAMPLES / 'component_profiling.py'}:layer_norm",
        "--input-shape",
        "2x1024",
        "--output-dir",
        str(tmp_path / "runs"),
        "tracking.enabled=true",
        f"tracking.uri={uri}",
        "report.console=false",
        *SHORT_WINDOWS,
    )
    assert component_command.run(args) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("anemoi-profiler").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["profiler.component.target"] == "LayerNorm"
    assert run.data.params["profiler.profiler.train.active"] == "2"  # the config, as for a Trainer run
    run_dir = run_folders(tmp_path / "runs")[0]
    assert run.data.tags["profiler.component"] == "LayerNorm" and run.data.tags["profiler.device"] == "cpu"
    assert run.data.tags["profiler.run_folder"] == str(run_dir) == run.data.params["profiler.run_folder"]
    assert run.data.metrics[names.component_summary("call_p50_ms")] > 0
    assert run.data.metrics[names.profiler_summary("windows/component")] == 2
    uploaded = {item.path for item in client.list_artifacts(run.info.run_id, "profiler")}
    assert {"profiler/time_report.csv", "profiler/memory_report.txt", "profiler/traces"} <= uploaded


def test_bad_inputs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="target 'no_such_module:factory': cannot import"):
        profile_component("no_such_module:factory", config=config_for(tmp_path))
    with pytest.raises(ConfigError, match="expected a floating torch dtype"):
        profile_component(torch.nn.Identity(), dtype="int64", config=config_for(tmp_path))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            profile_component(torch.nn.Identity(), device="cuda", config=config_for(tmp_path))
    with pytest.raises(ConfigError, match="give --target"):
        component_command.run(parse("--output-dir", str(tmp_path)))
    for bad_shape in ("8,x", "8,,4", "0,4"):
        with pytest.raises(SystemExit):
            parse("--input-shape", bad_shape)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layer_norm_on_cuda_in_bfloat16(tmp_path: Path) -> None:
    run_dir = profile_component(
        torch.nn.LayerNorm(1024),
        input_shapes=[(8, 512, 1024)],
        dtype="bfloat16",
        device="cuda",
        config=config_for(tmp_path),
        backward=True,
    )
    trace = read_trace(run_dir / "traces/component/window_0/rank0.pt.trace.json.gz")
    assert "kernel" in {e.get("cat") for e in trace["traceEvents"]}
    memory = json.loads((run_dir / "memory_report.json").read_text())
    assert memory["windows"][0]["device"] is True
    assert memory["profiled_steps"]["totals"]["peak_allocated_mb"] > 8  # input, output and gradients in bf16
