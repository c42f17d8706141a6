"""Figures across ranks, from every rank's `RankTotals` over the same intervals: spread, straggler, peaks.

- Step time: the mean over ranks, with `_min` and `_max`. Collectives make every rank's step time equal, so
  its spread shows no straggler; it shows ranks that do different work between collectives.
- Data wait (the fetch), other callbacks and Lightning's loop between steps: means over ranks per batch;
  data wait also its largest and that rank. Not reported when no fetch was timed.
- Collective wait per optimizer step: the wait for the gradient all-reduce (see `gradient_sync`) plus the
  time a rank spent in Lightning's loop beyond the rank that spent least there (the loop's per-batch
  stop-signal broadcast waits for every rank, and takes the waits of micro-batches under gradient
  accumulation). The rank that waits least is the one the others wait for (`rank_waited_for`: the throughput
  callback's `throughput/train/slowest_rank`);
  `time/train/straggler_ms` is how much longer the others wait than it does (mean over the others).
- Memory: each peak's largest value over ranks and its rank.
"""

from __future__ import annotations

from statistics import fmean  # statistics.mean sums exact Fractions; fmean sums floats, far cheaper

from anemoi_profiler import names
from anemoi_profiler.clock import PEAK_FIELDS, RankTotals


def step_figures(stage: str, ranks: list[RankTotals]) -> dict[str, float]:
    measured = [rank.step_ms for rank in ranks if rank.step_ms > 0]
    if not measured:
        return {}
    metrics = {names.timing(stage, "step_ms"): fmean(measured)}
    if len(ranks) > 1:
        metrics[names.timing(stage, "step_ms_min")] = min(measured)
        metrics[names.timing(stage, "step_ms_max")] = max(measured)
    return metrics


def gap_figures(stage: str, ranks: list[RankTotals]) -> dict[str, float]:
    """Data wait, other callbacks and loop per batch; data wait only when every rank timed its fetches."""
    counted = [rank for rank in ranks if rank.batches]
    if not counted:
        return {}
    metrics = {
        names.timing(stage, "callbacks_ms"): fmean(rank.per_batch_ms(rank.callbacks_s) for rank in counted),
        names.timing(stage, "loop_ms"): fmean(rank.per_batch_ms(rank.loop_s) for rank in counted),
    }
    if all(rank.fetches for rank in counted):
        waits = {index: rank.per_batch_ms(rank.wait_s) for index, rank in enumerate(ranks) if rank.batches}
        metrics[names.timing(stage, "dataloader_wait_ms")] = fmean(waits.values())
        if stage == "train" and len(ranks) > 1:
            slowest = max(waits, key=waits.__getitem__)
            metrics[names.TRAIN_DATALOADER_WAIT_MS_MAX] = waits[slowest]
            metrics[names.TRAIN_DATALOADER_SLOWEST_RANK] = float(slowest)
    return metrics


def collective_wait_figures(ranks: list[RankTotals]) -> dict[str, float]:
    """Empty unless every rank timed its gradient all-reduce (with one rank there is nobody to wait for)."""
    waits = collective_waits_ms(ranks)
    if not waits:
        return {}
    straggler = min(range(len(waits)), key=waits.__getitem__)
    others = [wait - waits[straggler] for index, wait in enumerate(waits) if index != straggler]
    return {
        names.TRAIN_COLLECTIVE_WAIT_MS: fmean(waits),
        names.TRAIN_COLLECTIVE_WAIT_MS_MIN: min(waits),
        names.TRAIN_COLLECTIVE_WAIT_MS_MAX: max(waits),
        names.TRAIN_STRAGGLER_MS: fmean(others),
    }


def rank_waited_for(ranks: list[RankTotals]) -> int | None:
    """The rank the others wait for: the one that waits least per optimizer step. A throughput figure
    (`throughput/train/slowest_rank`), computed here beside the waits it comes from."""
    waits = collective_waits_ms(ranks)
    return min(range(len(waits)), key=waits.__getitem__) if waits else None


def collective_waits_ms(ranks: list[RankTotals]) -> list[float]:
    """Each rank's collective wait per optimizer step (ms), by rank; empty unless every rank timed it."""
    if len(ranks) < 2 or not all(rank.sync_steps for rank in ranks):
        return []
    least_loop = min(rank.loop_s / rank.sync_steps for rank in ranks)
    return [
        (rank.collective_wait_s / rank.sync_steps + rank.loop_s / rank.sync_steps - least_loop) * 1000 for rank in ranks
    ]


def memory_figures(ranks: list[RankTotals]) -> dict[str, float]:
    """`memory/<peak>_max` and `memory/<peak>_max_rank` for the peaks some rank measured (several ranks only)."""
    metrics: dict[str, float] = {}
    if len(ranks) < 2:
        return metrics
    for field, key in PEAK_FIELDS.items():
        values = [getattr(rank, field) for rank in ranks]
        if any(values):
            largest = max(range(len(values)), key=values.__getitem__)
            metrics[f"{key}_max"] = values[largest]
            metrics[f"{key}_max_rank"] = float(largest)
    return metrics


def describe_ranks(hosts: list[str]) -> str:
    """`node-a: ranks 0-3; node-b: ranks 4-7`, short however many ranks a host has."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    return "; ".join(
        f"{host}: {'rank' if len(ranks) == 1 else 'ranks'} {_spans(ranks)}" for host, ranks in by_host.items()
    )


def _spans(ranks: list[int]) -> str:
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
