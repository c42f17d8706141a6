"""The public metric names, spelled out once more: what users, dashboards and docs/metrics.md rely on must not
change by accident when `anemoi_profiler.names` changes. The only test that spells metric names (see
test_architecture.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from anemoi_profiler import names

METRICS_DOC = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()

PUBLIC = {
    "throughput/train/samples_per_sec": names.TRAIN_SAMPLES_PER_SEC,
    "throughput/train/batches_per_sec": names.TRAIN_BATCHES_PER_SEC,
    "throughput/train/items_per_sec": names.TRAIN_ITEMS_PER_SEC,
    "throughput/train/device/samples_per_sec": names.TRAIN_DEVICE_SAMPLES_PER_SEC,
    "throughput/train/mfu": names.TRAIN_MFU,
    "throughput/train/slowest_rank": names.TRAIN_SLOWEST_RANK,
    "throughput/val/samples_per_sec": names.VAL_SAMPLES_PER_SEC,
    "time/train/step_ms": names.TRAIN_STEP_MS,
    "time/train/dataloader_wait_ms": names.TRAIN_DATALOADER_WAIT_MS,
    "time/train/dataloader_wait_ms_max": names.TRAIN_DATALOADER_WAIT_MS_MAX,
    "time/train/dataloader_slowest_rank": names.TRAIN_DATALOADER_SLOWEST_RANK,
    "time/train/collective_wait_ms": names.TRAIN_COLLECTIVE_WAIT_MS,
    "time/train/collective_wait_ms_min": names.TRAIN_COLLECTIVE_WAIT_MS_MIN,
    "time/train/collective_wait_ms_max": names.TRAIN_COLLECTIVE_WAIT_MS_MAX,
    "time/val/step_ms": names.VAL_STEP_MS,
    "memory/peak_allocated_mb": names.PEAK_ALLOCATED_MB,
    "memory/peak_reserved_mb": names.PEAK_RESERVED_MB,
    "memory/cpu_rss_mb": names.CPU_RSS_MB,
    "summary/train/samples_per_sec": names.SUMMARY_TRAIN_SAMPLES_PER_SEC,
    "summary/memory/peak_allocated_mb": names.SUMMARY_PEAK_ALLOCATED_MB,
    "summary/energy/joules_per_sample": names.SUMMARY_JOULES_PER_SAMPLE,
    "system/cpu_utilization_percentage": names.CPU_UTILIZATION,
    "system/gpu_0_utilization_percentage": names.gpu(0, "utilization_percentage"),
    "system/node_1/cpu_utilization_percentage": names.system("cpu_utilization_percentage", "node_1"),
    "system/cluster/cpu_utilization_percentage_median": names.cluster("cpu_utilization_percentage", "median"),
    "system/cluster/cpu_utilization_percentage_outlier_node": names.cluster(
        "cpu_utilization_percentage", "outlier_node"
    ),
    "system/cluster/gpu_utilization_percentage_min": names.cluster("gpu_utilization_percentage", "min"),
    "system/cluster/gpu_temperature_celsius_outlier_gpu": names.cluster("gpu_temperature_celsius", "outlier_gpu"),
    "hta/train/window_0/rank1/idle_pct": names.hta_window("train/window_0", names.hta_rank(1, "idle_pct")),
}


@pytest.mark.parametrize(("public", "spelled"), PUBLIC.items())
def test_public_names_keep_their_spelling(public: str, spelled: str) -> None:
    assert spelled == public


FIXED = {
    key: value
    for key, value in vars(names).items()
    if key.isupper() and isinstance(value, str) and not value.endswith("/")
}


def documented(metric: str) -> bool:
    """In docs/metrics.md as written, as its validation row (`throughput/val/...`), or as a `_min`/`_max` of a
    documented name (`time/train/collective_wait_ms`, `_min`, `_max`)."""
    base, suffix = re.fullmatch(r"(.+?)(_min|_max)?", metric).groups()
    stage_form = re.sub(r"^(\w+)/val/.*", r"\1/val/...", metric)
    return any(f"`{form}`" in METRICS_DOC for form in (metric, stage_form)) or bool(
        suffix and f"`{base}`, `_min`, `_max`" in METRICS_DOC
    )


@pytest.mark.parametrize("constant", sorted(key for key, value in FIXED.items() if not value.startswith("summary/")))
def test_every_named_metric_is_in_the_metrics_reference(constant: str) -> None:
    assert documented(FIXED[constant]), f"{constant} = {FIXED[constant]!r} is not in docs/metrics.md"


@pytest.mark.parametrize("constant", sorted(key for key, value in FIXED.items() if value.startswith("summary/")))
def test_every_end_of_run_name_is_documented_or_a_documented_metric_s_summary(constant: str) -> None:
    value = FIXED[constant]
    summaries_of_documented = {names.summary_of(metric) for metric in FIXED.values() if documented(metric)}
    assert f"`{value}`" in METRICS_DOC or value in summaries_of_documented, value
