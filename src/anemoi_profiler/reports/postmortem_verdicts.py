"""The post-mortems of a run folder as verdicts, which the diagnosis runs first so that the report and the run's
description lead with them (also `anemoi-profiler report` on the folder of a killed job).
"""

from __future__ import annotations

from typing import Any

from anemoi_profiler.reports.outcome import Verdict
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.run_files.postmortem_files import (
    KILLED,
    OUT_OF_MEMORY,
    STALL,
    peer_ended,
    read_records,
    read_stalls,
    stopped,
)


def postmortems(run: RunData) -> dict[str, Verdict]:
    """The post-mortems of the run folder as verdicts: none for a run that nothing stopped or held."""
    found: dict[str, Verdict] = {}
    # a kill last: how the run ended; a stall before it says where it was held
    checks = (("out of memory", out_of_memory), ("signal", signals), ("stall", stalls), ("killed", killed))
    for name, check in checks:
        try:
            verdict = check(run)
        except (KeyError, TypeError, ValueError) as error:  # a record of another version: said, never raised
            verdict = Verdict(name, name, "info", "unreadable record", f"{type(error).__name__}: {error}.", "-")
        if verdict is not None:
            found[name] = verdict
    return found


def out_of_memory(run: RunData) -> Verdict | None:
    records = read_records(run.folder, "oom_rank*.json")
    if not records:
        return None
    first = min(records, key=lambda record: (record.get("step") or 0, record["rank"]))
    ranks = ",".join(str(record["rank"]) for record in records)
    if first.get("kind") == "host":
        value = f"DataLoader worker killed ({first['error']}) at step {first['step']} on rank {ranks}"
        message = "The kernel killed a DataLoader worker, which is what its OOM killer does when host memory runs out"
        message += f"; {_host_figures(first)}" if first.get("host") else ""
        next_step = "Fewer num_workers or prefetch_factor, smaller samples in memory, or more host memory per task"
    else:
        value = f"at step {first['step']} on rank {ranks}, in {first['phase']} at {first['frame']}"
        message = f"{first['error']}; {_device_figures(first)}"
        next_step = (
            f"Open {first['file']} (and the snapshot beside it at pytorch.org/memory_viz where there is one); "
            "a smaller batch, activation checkpointing or a sharded strategy lower the peak"
        )
    return Verdict(OUT_OF_MEMORY, "out of memory", "high", value, message + ".", next_step)


def _device_figures(record: dict[str, Any]) -> str:
    device = record.get("device") or {}
    if "not_assessed" in device:
        return f"device memory not assessed ({device['not_assessed']})"
    said = [
        f"peak allocated {device['peak_allocated_mb']:.0f} MB and reserved {device['peak_reserved_mb']:.0f} MB "
        f"of {device['capacity_mb']:.0f} MB",
        f"fragmentation {device['fragmentation'] * 100:.0f} % of reserved",
    ]
    sites = record.get("top_allocation_sites") or []
    if sites:
        said.append(f"largest allocation site {sites[0]['site']} ({sites[0]['mb']:.0f} MB)")
    if record.get("snapshot_not_taken"):
        said.append(f"no snapshot: {record['snapshot_not_taken']}")
    return ", ".join(said)


def _host_figures(record: dict[str, Any]) -> str:
    host = record["host"]
    said = [f"host memory {host['used_percent']:.0f} % used of {host['total_mb']:.0f} MB"]
    if host.get("cgroup_limit_mb"):
        said.append(f"job limit (cgroup) {host['cgroup_limit_mb']:.0f} MB, peak {host.get('cgroup_peak_mb', 0):.0f} MB")
    if host.get("cgroup_oom_kills"):
        said.append(f"{host['cgroup_oom_kills']} OOM kills in the job's cgroup")
    return ", ".join(said)


def stalls(run: RunData) -> Verdict | None:
    records = read_stalls(run.folder)
    if not records:
        return None
    longest = max(records, key=lambda record: record.get("stalled_for_s") or 0.0)
    resumed = [record for record in records if record.get("resumed_after_s") is not None]
    value = f"{len(records)} stall{'s' if len(records) > 1 else ''}; {longest['summary']}"
    if len(resumed) == len(records):
        length = max(record["resumed_after_s"] for record in records)
        message = f"Every stall ended: the run moved on after at most {length:.0f} s without a finished batch"
    else:
        message = "The run did not move on from the last stall before it ended"
    next_step = (
        f"Read {longest['file']} (each rank's phase and frame) and postmortem/stall_<k>/rank<r>.json (every "
        "thread's stack); with NCCL, the Flight Recorder dumps beside them"
    )
    return Verdict(STALL, "stall", "high", value, message + ".", next_step)  # high: the post-mortems lead


def signals(run: RunData) -> Verdict | None:
    records = read_records(run.folder, "signal_rank*.json")
    if not records:
        return None
    first = min(records, key=lambda record: record["rank"])
    ranks = ",".join(str(record["rank"]) for record in records)
    value = f"{first['signal']} at step {first['step']} on rank {ranks}, in {first['phase']} at {first['frame']}"
    if run.header.get("status", "KILLED") == "KILLED":
        message = f"The run was {stopped(first)}: what was measured until then is in the report"
    else:
        message = f"{first['signal']} arrived and the run went on (the handler that was there decided)"
    next_step = "A scheduler's time limit sends SIGTERM: resume from the last checkpoint, or ask for more time"
    return Verdict("stopped-by-signal", "stopped by signal", "high", value, message + ".", next_step)


def killed(run: RunData) -> Verdict | None:
    """A process that vanished without a chance to speak, as the MLflow sender beside it saw it."""
    records = read_records(run.folder, "killed_rank*.json")
    if not records:
        return None
    first = min(records, key=lambda record: record["rank"])
    step = "before its first logged step" if first.get("step") is None else f"after step {first['step']}"
    value = f"rank {first['rank']} {step}: {first['cause']}"
    message = f"The MLflow sender beside rank {first['rank']} (pid {first['pid']} on {first['hostname']}) saw it vanish"
    for peer in first.get("peers_ended") or []:
        message += f"; {peer_ended(peer)}"
    memory = first.get("memory") or {}
    if memory:
        figures = ", ".join(f"{key} {value:.0f}" for key, value in memory.items())
        message += f"; rank {first['rank']}'s last memory figures: {figures}"
    if "OOM killer" in first["summary"]:
        next_step = "Host memory ran out: fewer DataLoader workers, smaller samples in memory, or more memory per task"
    else:
        next_step = (
            "Look for what killed it: a peer's death under Lightning's launcher (it kills every rank), the "
            "scheduler's log, or `dmesg` for the OOM killer where the job's cgroup does not count it"
        )
    return Verdict(KILLED, "killed", "high", value, message + ".", next_step)
