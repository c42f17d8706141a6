"""Whether two runs can be compared for speed: the facts of a run that move its step time, and where they differ.

A gate that compares an H200 run with an A100 run, bf16 with fp32, or 1 rank with 2, measures the setting, not
the change. `step_time_facts` reads what the run folder recorded (environment.json, config.yaml, the batch size
from the throughput figures); a fact that a run did not record is left out, never guessed.
"""

from __future__ import annotations

from typing import Any

import yaml

from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.run_files.layout import CONFIG_FILE

IGNORED_CONFIG = ("output_dir", "tracking", "report", "hta")
"""Sections of the profiler's config that do not move step time (where files go, MLflow, the report, HTA, which
runs after training)."""


def step_time_facts(run: RunData) -> dict[str, str]:
    """`{fact: value}`: hardware, parallelism, precision, batch size, versions, the model and the measured config."""
    env = run.environment
    devices = env.get("devices") or []
    packages = env.get("packages") or {}
    facts: dict[str, Any] = {
        "device": devices[0].get("name") if devices else ("cpu" if env else None),
        "device_count": len(devices) if env else None,
        "world_size": env.get("world_size", run.header.get("world size")),
        "nodes": env.get("num_nodes"),
        "strategy": env.get("strategy", run.header.get("strategy")),
        "precision": env.get("precision", run.header.get("precision")),
        "accumulate_grad_batches": env.get("accumulate_grad_batches"),
        "batch_size": _samples_per_batch(run),
        "model": run.header.get("model"),
        "torch": packages.get("torch"),
        "lightning": packages.get("lightning") or packages.get("pytorch-lightning"),
        "cuda": env.get("cuda"),
        "cudnn": env.get("cudnn"),
        "nccl": env.get("nccl"),
    }
    facts.update({f"config.{key}": value for key, value in _flat(_read_config(run)).items()})
    return {key: str(value) for key, value in facts.items() if value is not None}


def differences(a: RunData, b: RunData) -> dict[str, tuple[str, str]]:
    """Facts both runs recorded, with different values: `{fact: (A's, B's)}`."""
    facts_a, facts_b = step_time_facts(a), step_time_facts(b)
    return {key: (facts_a[key], facts_b[key]) for key in facts_a if key in facts_b and facts_a[key] != facts_b[key]}


def allowed(key: str, allowances: list[str]) -> bool:
    """Whether `--allow-mismatch` names the fact or a section above it (`config` allows every `config.*`)."""
    return any(key == allowance or key.startswith(allowance + ".") for allowance in allowances)


def _samples_per_batch(run: RunData) -> int | None:
    samples, batches = run.summary("train/samples_per_sec"), run.summary("train/batches_per_sec")
    return round(samples / batches) if samples and batches else None


def _read_config(run: RunData) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load((run.folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return {k: v for k, v in loaded.items() if k not in IGNORED_CONFIG} if isinstance(loaded, dict) else {}


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
