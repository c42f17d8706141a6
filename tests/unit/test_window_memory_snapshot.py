"""The memory snapshot of a triggered window: the memory trigger asks for one on the climbing rank, and on CPU
windows.json and the report say it was not assessed."""

from __future__ import annotations

from pathlib import Path

from anemoi_profiler import ProfilerConfig
from anemoi_profiler.clock import ExchangeControl, RankTotals
from anemoi_profiler.distributed.exchange import RankExchange
from anemoi_profiler.run.window_triggers import TriggerWatch, window_entries, windows_section


def test_the_memory_trigger_plans_a_snapshot_on_the_climbing_rank_not_assessed_on_cpu(tmp_path: Path) -> None:
    overrides = ["triggers.enabled=true", "triggers.warmup_intervals=1", "triggers.drift=false"]
    config = ProfilerConfig.load(None, [f"output_dir={tmp_path}", *overrides, "triggers.requests=false"])
    watch = TriggerWatch.of_config(
        config, world_size=2, rank=1, run_dir=tmp_path, exchange=RankExchange(), profiled_ranks=[0, 1]
    )
    step = 0
    while watch.pending is None and step < 400:
        step += 20
        climbing = 1000.0 + (10.0 * step if step > 100 else 0.0)
        ranks = [RankTotals(20, elapsed_s=2.0, cpu_rss_mb=1000.0), RankTotals(20, elapsed_s=2.0, cpu_rss_mb=climbing)]
        watch.received(step, ranks, [ExchangeControl()] * 2)
    assert watch.pending is not None, "the memory trigger did not fire"
    assert watch.pending.reason == "memory" and watch.pending.ranks == [1] and watch.pending.memory

    plan = watch.open_pending(0, step + 2)
    assert plan is not None
    (entry,) = window_entries(tmp_path, [plan], {}, "cpu")
    assert entry["memory_snapshot"].startswith("not assessed: a CUDA memory snapshot needs a CUDA device")
    section = windows_section([entry])
    assert section is not None and section.rows[0][-1] == entry["memory_snapshot"]


def test_a_window_without_a_snapshot_says_none(tmp_path: Path) -> None:
    overrides = ["triggers.enabled=true", "triggers.warmup_intervals=1", "triggers.memory=false"]
    config = ProfilerConfig.load(None, [f"output_dir={tmp_path}", *overrides, "triggers.requests=false"])
    watch = TriggerWatch.of_config(
        config, world_size=1, rank=0, run_dir=tmp_path, exchange=RankExchange(), profiled_ranks=[0]
    )
    step = 0
    while watch.pending is None and step < 2000:
        step += 20
        step_ms = 100.0 if step <= 400 else 150.0
        watch.received(step, [RankTotals(batches=20, elapsed_s=20 * step_ms / 1000)], [ExchangeControl()])
    plan = watch.open_pending(0, step + 2)
    assert plan is not None and plan.reason == "drift" and not plan.memory
    (entry,) = window_entries(tmp_path, [plan], {}, "cuda")
    assert entry["memory_snapshot"] is None
