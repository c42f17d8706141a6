"""The sender's post-mortem of a training process that vanished without a word.

The sender's stdin closes without the word that the spool is closed (or the sender is reparented) only when the
training process (rank 0) ended without running any Python: SIGKILL from the kernel's OOM killer, from Lightning's
launcher after a peer died or from a scheduler's hard kill, or a crash in native code. No one else will end its
MLflow run then: the sender sends what was spooled, writes `postmortem/killed_rank0.json` and, where the run folder
has none, `metrics.json` from the points it sent, and ends the run as KILLED, tagged `profiler.postmortem=killed`.

The cause is told where the machine tells it: the OOM kill count of the job's memory cgroup rising while the sender
ran (cgroup v2 `memory.events`, v1 `memory.oom_control`); else a signal the process could not handle. While
the training process lives, its children that are other ranks (Lightning's launcher starts ranks 1..n of a node
from rank 0) are watched: one that ends is noted with its exit status, which /proc shows until its parent reaps
it. Linux only where /proc is read; elsewhere those parts say nothing. Torch-free: this runs in the sender.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from anemoi_profiler import names
from anemoi_profiler.logs import get_logger
from anemoi_profiler.run_files.layout import METRICS_FILE
from anemoi_profiler.run_files.metrics_file import MetricHistory
from anemoi_profiler.run_files.postmortem_files import (
    KILLED,
    TAG,
    headline,
    killed_path,
    killed_summary,
    kinds,
    told,
)
from anemoi_profiler.tracking.records import Batch
from anemoi_profiler.tracking.spool import Target, pending_batches, read_batch, write_batch

log = get_logger(__name__)

PEER_POLL_S = 0.5
"""How often the sender looks at the training process's children; Lightning's launcher reaps a dead one within 5 s."""
OOM_KILLER = "killed by the kernel's OOM killer"
UNHANDLED_SIGNAL = "killed by a signal it could not handle (SIGKILL or similar)"
MEMORY_LEAVES = ("memory_usage_megabytes", "memory_usage_percentage")
"""`system/...` figures kept as the last memory figures: the node's (`system_memory_...`) and each GPU's."""
MEMORY_KEYS = (names.CPU_RSS_MB, names.PEAK_ALLOCATED_MB, names.PEAK_RESERVED_MB)


def oom_kills() -> int | None:
    """The OOM kills counted in this process's memory cgroup (v2 `memory.events`, else v1 `memory.oom_control`);
    None where neither is readable."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0":
                candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"]
                candidates.append(Path("/sys/fs/cgroup/unified") / path.lstrip("/") / "memory.events")
            elif "memory" in controllers.split(","):
                candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"]
            else:
                continue
            for candidate in candidates:
                with contextlib.suppress(OSError, ValueError):
                    counts = dict(entry.split() for entry in candidate.read_text().splitlines() if entry.strip())
                    if "oom_kill" in counts:
                        return int(counts["oom_kill"])
    return None


def exit_status(pid: int) -> str | None:
    """How child `pid` ended, read from /proc while it waits to be reaped (a zombie); None while it runs or once
    it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] != "Z" or len(fields) < 50 or not fields[-1].isdigit():
        return None
    status = int(fields[-1])  # exit_code, as waitpid reports it
    number = status & 0x7F
    if not number:
        return f"exit code {status >> 8 & 0xFF}"
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _rank_of(pid: int) -> str | None:
    """The rank in a process's environment as a launcher set it (RANK, else LOCAL_RANK); None where unreadable."""
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        values = dict(entry.split("=", 1) for entry in entries if "=" in entry)
    except (OSError, UnicodeDecodeError):
        return None
    return values.get("RANK") or values.get("LOCAL_RANK")


def _children(pid: int) -> set[int]:
    """The children that `pid`'s main thread started (where Lightning's launcher starts the other ranks): one read
    of /proc, not one per thread."""
    try:
        return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except (OSError, ValueError):
        return set()


class VanishWatch:
    """What the sender needs to tell of a training process that vanishes: the points it sent, the last step and
    memory figures, the ranks among the process's children that ended, the cgroup's OOM kills at the start."""

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir
        self.run_dir = spool_dir.parents[1]
        self.pid = os.getppid()
        self.hostname = socket.gethostname()
        self.oom_kills_at_start = oom_kills()
        self.history = MetricHistory()
        self.last_step: int | None = None
        self.memory: dict[str, float] = {}
        self.peers_ended: list[dict[str, Any]] = []
        self._own_rank = _rank_of(self.pid)
        self._peers: dict[int, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch_peers, name="anemoi-profiler-peers", daemon=True)
        self._thread.start()

    def noting(self, target: Target) -> Target:
        """`target`, noting what MLflow took of each batch (`replay_spool` then deletes the files; what it did not
        take is written back and noted when sent, or by `finish`)."""
        watch = self

        class Noting:
            def send(self, batch: Batch) -> None:
                metrics = list(batch.metrics)
                try:
                    target.send(batch)  # removes from the front what MLflow took, also when it fails midway
                finally:
                    watch.note(Batch(metrics=metrics[: len(metrics) - len(batch.metrics)]))

        return Noting()

    def note(self, batch: Batch) -> None:
        for key, value, _timestamp_ms, step in batch.metrics:
            self.history.add({key: value}, step)
            if not key.startswith(names.SYSTEM):
                self.last_step = max(int(step), self.last_step or 0)
            if key in MEMORY_KEYS or (key.startswith(names.SYSTEM) and key.endswith(MEMORY_LEAVES)):
                self.memory[key] = float(value)

    def _watch_peers(self) -> None:
        try:
            self._look_at_peers()
        except Exception as error:  # the peers go untold; the sender's work goes on
            log.info("no longer watching the other ranks: %s: %s", type(error).__name__, error)

    def _look_at_peers(self) -> None:
        while not self._stop.wait(PEER_POLL_S):
            alive = os.getppid() == self.pid
            if alive:
                for child in _children(self.pid) - set(self._peers) - {os.getpid()}:
                    rank = _rank_of(child)
                    if rank and rank.isdigit() and rank not in ("0", self._own_rank):  # no worker, no tracker
                        self._peers[child] = rank
            self._sweep(alive)
            if not alive:
                return

    def _sweep(self, alive: bool) -> None:
        """Note the peers that ended; `alive`: whether the training process was still there to see it."""
        with self._lock:
            for child, rank in list(self._peers.items()):
                ended = exit_status(child)
                if ended is not None or not Path(f"/proc/{child}").exists():
                    del self._peers[child]
                    if ended == "exit code 0":
                        continue  # it finished: nothing to tell
                    peer = {"rank": int(rank), "pid": child, "exit": ended, "first": alive, "at": time.time()}
                    self.peers_ended.append(peer)

    def finish(self, target: Target) -> Path | None:
        """The training process vanished: the record, metrics.json, and the run ended as KILLED (through the spool
        when MLflow does not take it now: `anemoi-profiler sync` sends it). Never raises."""
        self._stop.set()
        self._thread.join(2 * PEER_POLL_S)
        self._sweep(alive=False)  # the peers it had, as they are now (the launcher may have reaped them)
        try:
            for path in pending_batches(self.spool_dir):  # not sent: MLflow away at the last pass
                with contextlib.suppress(OSError, ValueError, TypeError):
                    self.note(read_batch(path))
            record = self.record()
            path = killed_path(self.run_dir, 0)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2))
            if not (self.run_dir / METRICS_FILE).exists() and self.history.to_json():
                self.history.write(self.run_dir)
        except OSError as error:
            log.warning("could not write the record of the vanished training process: %s", error)
            record, path = self.record(), None
        found = kinds(self.run_dir) or [KILLED]
        batch = Batch(tags={TAG: ",".join(found)}, terminate="KILLED")
        said = headline(self.run_dir) or ""  # a stall told before stays in the description
        if record["summary"] not in said:  # the disk refused the record
            said = "; ".join(filter(None, [record["summary"], said]))
        batch.description = told(said)
        try:
            target.send(batch)
        except Exception as error:
            log.warning("MLflow did not take the end of the killed run (%s); it is in the spool", error)
            with contextlib.suppress(OSError):
                write_batch(batch, self.spool_dir / f"batch-{time.time_ns():020d}-killed.json")
        return path

    def record(self) -> dict[str, Any]:
        at_end = oom_kills()
        oom = at_end is not None and self.oom_kills_at_start is not None and at_end > self.oom_kills_at_start
        first = [peer for peer in self.peers_ended if peer["first"]]
        for peer in first:
            if oom and peer["exit"] == "SIGKILL":
                peer["cause"] = OOM_KILLER
        if first:  # Lightning's launcher (rank 0's thread) SIGKILLs every rank when one dies
            cause = f"killed after rank {first[0]['rank']} ended (its launcher ends every rank when one dies)"
        else:
            cause = OOM_KILLER if oom else UNHANDLED_SIGNAL
        record = {
            "rank": 0,
            "pid": self.pid,
            "hostname": self.hostname,
            "step": self.last_step,
            "vanished_at": time.time(),
            "cause": cause,
            "oom_kills": {"at_start": self.oom_kills_at_start, "at_end": at_end},
            "memory": dict(sorted(self.memory.items())),
            "peers_ended": list(self.peers_ended),
            "seen_by": "the MLflow sender (stdin closed without the spool's close)",
        }
        record["summary"] = killed_summary(record)
        return record
