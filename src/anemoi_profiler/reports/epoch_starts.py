"""The diagnosis's check of the time at training epochs' starts, which the steady figures leave out.

From an epoch's start to its first batch the training waits: with `persistent_workers=False` the DataLoader's
workers start again and open the dataset again, every epoch. The throughput callback measures that time apart
from the steps (`summary/train/epoch_start_s`, its share of the training time); this names it when it
matters. A module of its own beside `diagnosis`, which lists it in `CHECKS`.
"""

from __future__ import annotations

from typing import Any

from anemoi_profiler import names
from anemoi_profiler.reports.outcome import NotAssessed, Outcome, Verdict
from anemoi_profiler.reports.run_data import RunData

EPOCH_START_SHARE = 0.10
"""Share of the all-in training time (every step after the warmup plus the epoch starts) spent at epochs'
starts, waiting for their first batch, above which the epoch starts slow the run down."""
EPOCH_START_SHARE_HIGH = 0.30


def slow_epoch_starts(run: RunData) -> Outcome:
    share, seconds = run.summary("train/epoch_start_share"), run.summary("train/epoch_start_s")
    starts = run.summary("train/epoch_starts")
    if share is None or seconds is None or not starts:
        return NotAssessed("no training epoch started after the warmup")
    if share < EPOCH_START_SHARE:
        return None
    steady = run.last(names.SUMMARY_TRAIN_SAMPLES_PER_SEC)
    whole = run.last(names.SUMMARY_TRAIN_SAMPLES_PER_SEC_ALL_IN) or run.last(
        names.with_epoch_starts(names.TRAIN_SAMPLES_PER_SEC)  # runs from before the all-in name
    )
    rates = f"; {steady:.4g} samples/s steady, {whole:.4g} all in" if steady and whole else ""
    data: dict[str, Any] = (run.sections.get("Throughput") or {}).get("data") or {}
    workers, persistent = data.get("train/dataloader_workers"), data.get("train/persistent_workers")
    if workers and persistent is False:
        message = (
            f"Every epoch starts the training DataLoader's {workers} worker(s) again (persistent_workers=False): "
            "they start up and open the dataset again while the training waits for the epoch's first batch."
        )
        next_step = (
            "Set persistent_workers=True on the training DataLoader: its workers then live through the run. Make "
            "the dataset cheap to open in a worker (open files lazily, once per worker); fewer, longer epochs help too."
        )
    else:
        how = {0: "no worker processes", None: "workers not known"}.get(workers, "persistent workers")
        message = f"The training waits at every epoch's start for its first batch (a DataLoader with {how})."
        next_step = (
            "Look at what runs before an epoch's first batch: workers started again (persistent_workers=True keeps "
            "them), on_train_epoch_start hooks, the sampler's set_epoch, an IterableDataset's __iter__ opening "
            "files, reload_dataloaders_every_n_epochs."
        )
    return Verdict(
        "epoch-start-bound",
        "slow epoch starts",
        "high" if share >= EPOCH_START_SHARE_HIGH else "medium",
        f"{share:.0%} of training time at {starts:.0f} epoch starts ({seconds:.2f} s, {seconds / starts:.2f} s each, "
        f"from on_train_epoch_start to the epoch's first batch{rates})",
        message,
        next_step,
    )
