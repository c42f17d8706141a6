"""Each measured step's duration, as the run folder keeps it (`steps.json`): the replicates a regression test needs.

A duration is stored as a whole number of `QUANTUM` steps on a log scale (relative error at most 0.1 %, far below
any slowdown worth testing), as 16-bit offsets from the median code with their low and high bytes apart,
zlib-compressed and base64-encoded in JSON: about 13 KB per 10,000 steps at 3 % step-to-step noise, most of it
the noise itself (docs/regression-gate.md).
Each step has a flag byte that says why it is not steady state (`FLAGS`), so a reader can keep the steady steps
only. Torch-free: `compare` reads it.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anemoi_profiler.run_files.layout import STEPS_FILE

FORMAT = 1
QUANTUM = 0.002
"""Relative width of one quantisation step: codes are round(ln(seconds) / ln(1 + QUANTUM))."""
WARMUP, PROFILED, AFTER_OTHER_STAGE, CHECKPOINT, OWN_WORK, EPOCH_START = 1, 2, 4, 8, 16, 32
FLAGS = {
    "warmup": WARMUP,
    "profiled": PROFILED,
    "after_other_stage": AFTER_OTHER_STAGE,
    "checkpoint": CHECKPOINT,
    "own_work": OWN_WORK,
    "epoch_start": EPOCH_START,
}
"""What happened in a step: before `throughput.warmup_steps`; inside a torch.profiler window (in training, one on
any rank: the others wait for it); the first step of a stage after another ran (training after validation, a
validation run's first batch); a checkpoint was saved in it; the profiler's own work (trace export, snapshot dump)
ran in it; the first step of a training epoch."""
NOT_STEADY = WARMUP | PROFILED | AFTER_OTHER_STAGE | OWN_WORK | EPOCH_START
"""The flags that leave a step out of the steady figures (the headline, the gate's step times). A checkpoint is not
among them: saving one is the training's own periodic work, seen as other callbacks' time, and a long save makes
its interval a slow stretch, set apart like any other."""


@dataclass(frozen=True)
class StepSeries:
    """One stage's step durations in seconds and their flags, in the order the steps ran."""

    seconds: np.ndarray
    flags: np.ndarray

    def steady(self) -> np.ndarray:
        return self.seconds[(self.flags & NOT_STEADY) == 0]

    def flagged(self) -> dict[str, int]:
        """How many steps carry each flag."""
        return {name: int(np.count_nonzero(self.flags & bit)) for name, bit in FLAGS.items()}


def encode(seconds: np.ndarray, flags: np.ndarray) -> dict[str, Any]:
    """One stage's series as a JSON-ready dict; durations of zero or less are kept as the smallest code."""
    seconds = np.maximum(np.asarray(seconds, dtype=np.float64), 1e-9)
    codes = np.rint(np.log(seconds) / math.log1p(QUANTUM)).astype(np.int64)
    reference = int(np.median(codes)) if len(codes) else 0
    offsets = np.clip(codes - reference, -(2**15), 2**15 - 1).astype("<i2")
    return {
        "count": len(codes),
        "reference": reference,
        "durations": _pack(offsets.view(np.uint8).reshape(-1, 2).T.tobytes()),
        "flags": _pack(np.asarray(flags, dtype=np.uint8).tobytes()),
    }


def decode(stage: dict[str, Any]) -> StepSeries:
    planes = np.frombuffer(_unpack(stage["durations"]), dtype=np.uint8).reshape(2, -1)
    codes = planes.T.copy().view("<i2").ravel().astype(np.int64) + int(stage["reference"])
    flags = np.frombuffer(_unpack(stage["flags"]), dtype=np.uint8)
    if len(codes) != stage["count"] or len(flags) != stage["count"]:
        raise ValueError(f"{STEPS_FILE}: {stage['count']} steps announced, {len(codes)} durations, {len(flags)} flags")
    return StepSeries(np.exp(codes * math.log1p(QUANTUM)), flags)


def write_steps(run_dir: Path, stages: dict[str, tuple[np.ndarray, np.ndarray]], rank: int, clock: str) -> Path:
    document = {
        "format": FORMAT,
        "rank": rank,
        "clock": clock,
        "quantum": QUANTUM,
        "flags": FLAGS,
        "stages": {name: encode(seconds, flags) for name, (seconds, flags) in stages.items() if len(seconds)},
    }
    path = Path(run_dir) / STEPS_FILE
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def read_steps(run_dir: Path) -> dict[str, StepSeries]:
    """Each stage's series of a run folder; {} without a readable `steps.json` (older runs, runs without it)."""
    try:
        document = json.loads((Path(run_dir) / STEPS_FILE).read_text(encoding="utf-8"))
        return {name: decode(stage) for name, stage in (document.get("stages") or {}).items()}
    except (OSError, ValueError, KeyError, TypeError, zlib.error):
        return {}


def _pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def _unpack(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))
