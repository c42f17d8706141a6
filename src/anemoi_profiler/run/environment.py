"""What a reader of a profile needs to reproduce or compare it: versions, hardware, parallelism, commit."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

from anemoi_profiler.redaction import redact
from anemoi_profiler.report_sections import MB
from anemoi_profiler.trainer import trainer_info

_PACKAGES = ("anemoi-profiler", "torch", "lightning", "pytorch-lightning", "mlflow", "omegaconf", "torchinfo")
_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_JOB_ID", "SLURM_NNODES")


def collect_environment(trainer: Any | None = None) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "packages": {name: _version(name) for name in _PACKAGES},
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl_version(),
        "devices": _devices(),
        "git_commit": git_commit(),
        "env": redact({name: os.environ[name] for name in _ENV_VARS if name in os.environ}),
    }
    if trainer is not None:
        env.update(
            world_size=trainer_info.world_size(trainer),
            num_nodes=trainer_info.num_nodes(trainer),
            strategy=trainer_info.strategy_name(trainer),
            precision=trainer_info.precision(trainer),
            accelerator=type(getattr(trainer, "accelerator", None)).__name__,
            accumulate_grad_batches=getattr(trainer, "accumulate_grad_batches", 1),
        )
    return env


def git_commit(cwd: str | None = None) -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def _nccl_version() -> str | None:
    """NCCL's version as torch was built with it (a change moves the step time of multi-GPU runs)."""
    import torch

    try:
        version = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else None if version is None else str(version)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _devices() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "memory_mb": round(props.total_memory / MB),
                "sm_count": props.multi_processor_count,
            }
        )
    return devices


def report_header(environment: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """The report's header lines that come from the environment and the trainer."""
    devices = environment.get("devices") or []
    model = getattr(trainer, "lightning_module", None)
    return {
        "model": type(model).__name__ if model is not None else "n/a",
        "device": devices[0]["name"] if devices else "cpu",
        "world size": environment.get("world_size", 1),
        "precision": environment.get("precision"),
        "strategy": environment.get("strategy"),
        "versions": ", ".join(f"{k} {v}" for k, v in environment["packages"].items() if v),
    }
