"""What the training thread hands the sink, and the batch the sink spools and the sender sends.

The queue carries one typed record per call (`Metric`, `Params`, `Tags`, `Description`, `Artifact`, `Terminate`), plus
`FlushRequest`s and batches handed back by a disk that refused them. The sink's thread merges them into a
`Batch`, the unit of the spool files (and of the sender's stdin, when the disk refuses); `Batch.to_dict` is their
JSON form.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Metric:
    key: str
    value: float
    timestamp_ms: int
    step: int


@dataclass(frozen=True)
class Params:
    values: dict[str, str]


@dataclass(frozen=True)
class Tags:
    values: dict[str, str]


@dataclass(frozen=True)
class Description:
    """The profiler's section of the run's description (Markdown). Only the sender process, which can read the
    run, merges it into the description: whatever else the description holds is the user's and stays."""

    section: str


@dataclass(frozen=True)
class Artifact:
    local_path: str
    artifact_dir: str


@dataclass(frozen=True)
class Terminate:
    status: str


@dataclass(frozen=True)
class FlushRequest:
    """Set `done` once everything queued before it was sent or spooled."""

    done: threading.Event


@dataclass
class Batch:
    """Records waiting to be sent together; the unit written to the spool."""

    metrics: list[list[Any]] = field(default_factory=list)  # [key, value, timestamp_ms, step]
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[list[str]] = field(default_factory=list)  # [local_path, artifact_dir]
    terminate: str | None = None
    description: str | None = None  # None in spool files written by 0.1.0, which had no description

    def add(self, record: Record) -> None:
        if isinstance(record, Metric):
            self.metrics.append([record.key, record.value, record.timestamp_ms, record.step])
        elif isinstance(record, Params):
            self.params.update(record.values)
        elif isinstance(record, Tags):
            self.tags.update(record.values)
        elif isinstance(record, Artifact):
            self.artifacts.append([record.local_path, record.artifact_dir])
        elif isinstance(record, Terminate):
            self.terminate = record.status
        elif isinstance(record, Description):
            self.description = record.section
        else:
            self.merge(record)

    def merge(self, other: Batch) -> None:
        self.metrics += other.metrics
        self.params.update(other.params)
        self.tags.update(other.tags)
        self.artifacts += other.artifacts
        self.terminate = other.terminate or self.terminate
        self.description = other.description if other.description is not None else self.description

    def empty(self) -> bool:
        return not (self.metrics or self.params or self.tags or self.artifacts or self.terminate) and (
            self.description is None
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Batch:
        return cls(**data)


Record = Metric | Params | Tags | Description | Artifact | Terminate | Batch
"""What `Batch.add` takes: one call's record, or a whole batch handed back."""


def drain(records: queue.SimpleQueue[Record | FlushRequest]) -> tuple[Batch, list[threading.Event]]:
    """Everything queued so far as one batch, and the flush requests among it to answer once it is spooled."""
    batch, flushes = Batch(), list[threading.Event]()
    while True:
        try:
            item = records.get_nowait()
        except queue.Empty:
            return batch, flushes
        if isinstance(item, FlushRequest):
            flushes.append(item.done)
        else:
            batch.add(item)
