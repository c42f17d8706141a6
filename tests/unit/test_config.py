"""Config loading: presets, YAML, overrides, and errors that name the key and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from anemoi_profiler.config import ConfigError, ProfilerConfig, preset_path

REPO = Path(__file__).resolve().parents[2]


def test_defaults_presets_yaml_and_overrides(tmp_path: Path) -> None:
    default = ProfilerConfig.load()
    assert default.throughput.enabled and not default.profiler.enabled
    detailed = ProfilerConfig.load("detailed")
    assert detailed.profiler.enabled and detailed.memory_snapshot.enabled
    path = tmp_path / "profiler.yaml"
    path.write_text("output_dir: /data/runs\ntracking:\n  experiment: weather\nsystem:\n  interval_s: 2\n")
    config = ProfilerConfig.load(path, overrides=["throughput.warmup_steps=10", "tracking.uri=sqlite:///x.db"])
    assert (config.output_dir, config.tracking.experiment, config.system.interval_s) == ("/data/runs", "weather", 2.0)
    assert (config.throughput.warmup_steps, config.tracking.uri) == (10, "sqlite:///x.db")
    assert ProfilerConfig.load({"log_every_n_steps": 7}).log_every_n_steps == 7


def test_fingerprint_follows_the_resolved_config() -> None:
    assert ProfilerConfig.load().fingerprint() == ProfilerConfig.load().fingerprint()
    assert ProfilerConfig.load().fingerprint() != ProfilerConfig.load(None, ["log_every_n_steps=7"]).fingerprint()
    assert len(ProfilerConfig.load().fingerprint()) == 8


def test_examples_presets_match_the_packaged_ones() -> None:
    for name in ("simple", "detailed"):
        assert (REPO / "examples" / f"{name}.yaml").read_text() == preset_path(name).read_text()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["throughput.warmupsteps=3"], r"throughput\.warmupsteps: unknown key; allowed keys in throughput: enabled, "),
        (["tracking.nope=1"], r"allowed keys in tracking: enabled, uri, experiment"),
        (["nope=1"], r"nope: unknown key; allowed keys: output_dir, log_every_n_steps"),
        (["throughput.warmup_steps=abc"], r"throughput\.warmup_steps: .*'abc'.*expected int"),
        (["throughput.warmup_steps=-1"], r"throughput\.warmup_steps: got -1, expected an integer >= 0"),
        (["system.interval_s=0"], r"system\.interval_s: got 0\.0, expected a number of seconds > 0"),
        (["tracking.enabled=maybe"], r"tracking\.enabled: .*expected bool"),
        (["profiler.train.active=0"], r"profiler\.train\.active: got 0, expected an integer >= 1"),
        (["throughput.length_fn=no_colon"], r"throughput\.length_fn: got 'no_colon'"),
        (["warmup_steps"], r"override 'warmup_steps': expected key=value"),
    ],
)
def test_errors_name_the_key_and_what_is_allowed(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProfilerConfig.load(None, overrides)


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such file, and not a preset \(presets: simple, detailed\)"):
        ProfilerConfig.load("fast")
    broken = tmp_path / "broken.yaml"
    broken.write_text("throughput: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        ProfilerConfig.load(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        ProfilerConfig.load(listing)


def test_cli_reports_config_errors_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "anemoi_profiler.cli", "config", "throughput.warmup_steps=-3"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "throughput.warmup_steps: got -3" in result.stderr
    assert "Traceback" not in result.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "anemoi_profiler.cli", "config", "--preset", "detailed", "system.interval_s=3"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "interval_s: 3.0" in ok.stdout


def test_configuration_reference_is_up_to_date() -> None:
    sys.path.insert(0, str(REPO / "docs"))
    from gen_config_reference import render

    assert (REPO / "docs" / "configuration.md").read_text() == render(), "run python docs/gen_config_reference.py"
