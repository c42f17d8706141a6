"""Which device work is communication, memory, compute or other: HTA's name rules, plus gloo's host collectives.

The patterns are HTA's (`hta/common/types.py`: `CommunicateKernelGroupingPattern`, `MemoryKernelGroupingPattern`,
`ComputeKernelGroupingPattern`), checked in HTA's order (communication first), so both tools put each kernel
in the same class. Each class carries the rule that matched, so a summary can say which rule classified what.
"""

from __future__ import annotations

import re

COMPUTE, COMMUNICATION, MEMORY, OTHER = 0, 1, 2, 3
KIND_NAMES = ("compute", "communication", "memory", "other")

# (rule name, kind, pattern matched at the start of the name, as HTA's re.match does)
DEVICE_RULES: tuple[tuple[str, int, re.Pattern[str]], ...] = (
    ("nccl_prefix", COMMUNICATION, re.compile(r"nccl")),  # ncclKernel_*, ncclDevKernel_* (NCCL and RCCL)
    ("hip_prefix", COMMUNICATION, re.compile(r"hip")),  # HTA counts every hip* device event as communication
    ("hccl_prefix", COMMUNICATION, re.compile(r"hccl")),
    ("ncclKernel_inside", COMMUNICATION, re.compile(r".*ncclKernel")),  # e.g. `void ncclKernel_AllReduce...`
    ("memcpy", MEMORY, re.compile(r"(hip)?Memcpy")),
    ("memset", MEMORY, re.compile(r"(hip)?Memset")),
    ("dma", MEMORY, re.compile(r"dma")),
    (
        "not_compute",
        OTHER,
        re.compile(
            r"(.*Memcpy)|(.*Memset)|(.*dma)|(.*Sync)|(Stream Wait Event)|(cuda.*LaunchKernel)|(runFunction)"
            r"|(job_exe)|(packet)|(pe_exe)|(cpum_exe_subgraph)|(collective_subgraph_execution)"
        ),
    ),
)
COMPUTE_RULE = "compute"
RULE_NAMES = (*(rule for rule, _, _ in DEVICE_RULES), COMPUTE_RULE)

HOST_COLLECTIVE = re.compile(r"(gloo|nccl|mpi|ucc):")
"""Host-side collective annotations (`gloo:all_reduce`, `nccl:all_reduce`): on a CPU-only rank, gloo's are
where the communication time is."""


def classify_device(name: str) -> tuple[int, int]:
    """The kind of a device event's name and the index of the rule (in `RULE_NAMES`) that decided it."""
    for index, (_, kind, pattern) in enumerate(DEVICE_RULES):
        if pattern.match(name):
            return kind, index
    return COMPUTE, len(DEVICE_RULES)


def is_host_collective(name: str) -> bool:
    return HOST_COLLECTIVE.match(name) is not None
