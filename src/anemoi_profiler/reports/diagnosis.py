"""What limits this run: a few verdicts, each with the number behind it and one concrete next step.

The anchor tools show measurements (Lightning's throughput, MLflow's system metrics, HTA's breakdowns) and
leave the conclusion to the reader; this draws it. Pure functions over `RunData` (read back from the run
folder), so the end-of-run report, `anemoi-profiler report` and the tests give the same answer. Every
threshold is a module constant, listed in docs/reports.md. Step times, data wait and MFU are the steady-state figures
(`RunData.steady`, `reports.steady`): a slow stretch, such as a slow start, does not decide; it has a check of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from statistics import mean, median

from anemoi_profiler import names
from anemoi_profiler.report_sections import ReportSection
from anemoi_profiler.reports.epoch_starts import slow_epoch_starts
from anemoi_profiler.reports.outcome import SEVERITY_ORDER, NotAssessed, Outcome, Verdict
from anemoi_profiler.reports.postmortem_verdicts import postmortems
from anemoi_profiler.reports.run_data import RunData
from anemoi_profiler.reports.slow_stretch import slow_stretches

TITLE = "Diagnosis"

DATALOADER_WAIT_SHARE = 0.15
"""Share of training step time spent waiting for the next batch above which the run is dataloader-bound."""
DATALOADER_WAIT_SHARE_HIGH = 0.40
HOST_WAIT_SHARE = 0.15
"""Share of the step time not spent waiting for data in which the GPU sits idle waiting for the host (HTA's
idle breakdown) above which the run is host-bound."""
HOST_WAIT_SHARE_HIGH = 0.40
"""Share of the whole step time above which host-bound is high severity."""
DEVICE_BUSY_UNKNOWN_IDLE = 0.40
"""Without HTA: the same share, from kernel time per step (1 - kernel time - data wait). Higher than
HOST_WAIT_SHARE because the time report lists only the top operators, so kernel time is a lower bound."""
COMM_OVERLAP_LOW_PCT = 50.0
"""HTA's communication/computation overlap (% of communication time hidden behind compute) below which
communication is exposed."""
COMM_KERNEL_SHARE_MIN_PCT = 10.0
"""Communication kernels' share of GPU kernel time below which exposed communication is not worth acting on."""
COMM_KERNEL_SHARE_HIGH_PCT = 30.0
STRAGGLER_SHARE = 0.10
"""How long the other ranks wait for the slowest one per optimizer step, as a share of the step, above which
one rank holds the others back."""
STRAGGLER_SHARE_HIGH = 0.30
STRAGGLER_ABOVE_SPREAD = 1.0
"""Multiple of the step time's own spread between log intervals (median absolute deviation, per optimizer step)
that a wait below `STRAGGLER_SHARE_HIGH` must pass to be told apart from the node's noise: on a busy machine,
balanced ranks wait for one another more than `STRAGGLER_SHARE` of a step while the step time itself swings more."""
DATA_EXPLAINS_STRAGGLER = 0.5
"""Share of the straggler's lead that its own extra data wait must cover to be named as the cause."""
STARTUP_COVERS_TYPICAL = 0.5
"""Share of the measured training that ran beside the profiler's own start-up from which the steady figures did
too: a wait below `STRAGGLER_SHARE_HIGH` is then not told apart from that start-up's cost."""
CALLBACKS_SHARE = 0.15
"""Share of training step time in other callbacks' batch hooks between the steps above which they slow it."""
CALLBACKS_SHARE_HIGH = 0.40
SPREAD_MIN_INTERVALS = 3
"""Fewer log intervals than this give no spread of the step time."""
MEMORY_NEAR_LIMIT = 0.90
"""Peak reserved (or allocated) memory over device memory above which the run is near out-of-memory."""
MEMORY_HEADROOM = 0.50
"""Peak allocated memory over device memory below which a larger batch fits."""
MAX_BATCH_FACTOR = 8
"""Larger batch factors than this are not spelled out: optimisation, not memory, limits them."""
MFU_LOW = 0.30
"""Model FLOPs utilisation below which the device's arithmetic is mostly unused."""
MFU_VERY_LOW = 0.10


def dataloader_bound(run: RunData) -> Outcome:
    """On the measured fetch time; with several ranks the rank that waits longest, which sets everyone's pace."""
    step_ms = run.steady(names.TRAIN_STEP_MS)
    if not step_ms:
        return NotAssessed("no training step times: timing off, or no batch after the warmup")
    wait_ms, where = run.steady(names.TRAIN_DATALOADER_WAIT_MS_MAX), ""
    if wait_ms is not None:
        rank = run.last(names.SUMMARY_TRAIN_DATALOADER_SLOWEST_RANK)
        where = f" on rank {rank:.0f}" if rank is not None else ""
    else:
        wait_ms = run.steady(names.TRAIN_DATALOADER_WAIT_MS)
    if wait_ms is None:
        return NotAssessed("the fetch from the dataloader was not timed (see docs/metrics.md)")
    share = wait_ms / step_ms
    if share < DATALOADER_WAIT_SHARE:
        return None
    return Verdict(
        "dataloader-bound",
        "dataloader-bound",
        "high" if share >= DATALOADER_WAIT_SHARE_HIGH else "medium",
        f"{share:.0%} of training step time waits for data{where} ({wait_ms:.1f} of {step_ms:.1f} ms per "
        "batch, steady state)",
        "The training loop waits for the next batch: the input pipeline, not the model, sets the pace.",
        "Raise the DataLoader's num_workers (about one per free CPU core), set pin_memory=True and "
        "persistent_workers=True (prefetch_factor for bursty loading); move decoding and augmentation out of "
        "__getitem__ or precompute them.",
    )


def host_bound(run: RunData) -> Outcome:
    """GPU idle because the host does not launch work fast enough: HTA's idle breakdown, else kernel time.

    Data wait also starves the GPU; it is the dataloader verdict's, so only the idle time beyond it counts,
    judged against the time the step does not spend waiting for data (what remains once data is fixed).
    """
    if not run.on_gpu:
        return NotAssessed("CPU run, the host is the device")
    idle = _by_rank(run, "idle_pct")
    host_wait = _by_rank(run, "idle_host_wait_share_pct")
    ranks = sorted(set(idle) & set(host_wait))
    if ranks:
        waiting = mean(idle[r] * host_wait[r] for r in ranks) / 1e4
        source, values = run.analysis_values()
        windows = ", ".join(sorted({v.window for v in values if v.name == "idle_pct"}))
        evidence = (
            f"{source} over {windows or 'the traces'}: GPU idle {mean(idle[r] for r in ranks):.0f}%, "
            f"{mean(host_wait[r] for r in ranks):.0f}% of it waiting for the host"
        )
        threshold = HOST_WAIT_SHARE
    else:
        busy_ms, step_ms = run.device_busy_ms_per_step("train"), run.steady(names.TRAIN_STEP_MS)
        if busy_ms is None or not step_ms:
            return NotAssessed("no idle breakdown (HTA, window summary) and no device times in the time report")
        waiting = 1.0 - busy_ms / step_ms
        evidence = f"GPU kernels busy {busy_ms:.1f} of {step_ms:.1f} ms per step, top operators of the profiled steps"
        threshold = DEVICE_BUSY_UNKNOWN_IDLE
    data_share = min(_data_wait_share(run), 1.0)
    beyond_data = max(waiting - data_share, 0.0)
    of_the_rest = beyond_data / (1.0 - data_share) if data_share < 1.0 else 0.0
    if of_the_rest < threshold:
        return None
    if data_share >= 0.01:
        value = (
            f"beyond the {data_share:.0%} data wait, the GPU waits for the host {beyond_data:.0%} of the step, "
            f"{of_the_rest:.0%} of the time left ({evidence})"
        )
    else:
        value = f"the GPU waits for the host {beyond_data:.0%} of the step ({evidence})"
    return Verdict(
        "host-bound",
        "host-bound",
        "high" if beyond_data >= HOST_WAIT_SHARE_HIGH else "medium",
        value,
        "The GPU finishes its kernels faster than Python and the launch path issue them: it waits for the host.",
        "Give each launch more work: a larger batch, torch.compile to fuse small kernels, CUDA graphs "
        '(torch.compile(mode="reduce-overhead")); remove host syncs from the step (.item(), .cpu(), printing '
        "tensors, sync_dist=True on every log).",
    )


def communication_bound(run: RunData) -> Outcome:
    overlap = _by_rank(run, "comm_comp_overlap_pct")
    if not overlap:
        return NotAssessed("no communication analysis: one process, no NCCL kernels, or HTA and window summary off")
    source, values = run.analysis_values()
    shares = [v.value for v in values if v.rank is None and v.name == "communication_kernel_time_pct"]
    comm_share = mean(shares) if shares else None
    mean_overlap = mean(overlap.values())
    if mean_overlap >= COMM_OVERLAP_LOW_PCT or (comm_share is not None and comm_share < COMM_KERNEL_SHARE_MIN_PCT):
        return None
    worst = min(overlap, key=overlap.__getitem__)
    of_kernels = f"communication kernels {comm_share:.0f}% of GPU kernel time; " if comm_share is not None else ""
    return Verdict(
        "communication-bound",
        "communication-bound",
        "high" if comm_share is not None and comm_share >= COMM_KERNEL_SHARE_HIGH_PCT else "medium",
        f"{of_kernels}{mean_overlap:.0f}% of communication time overlaps compute "
        f"({source}; least: rank {worst}, {overlap[worst]:.0f}%)",
        "Collectives run while the GPU has no compute to hide them behind, so every step waits for the network.",
        "Overlap gradient reduction with backward (DDP: gradient_as_bucket_view=True, tune bucket_cap_mb; FSDP: "
        "backward_prefetch, forward_prefetch); fewer, larger collectives; check the transport with "
        "NCCL_DEBUG=INFO.",
    )


def callback_bound(run: RunData) -> Outcome:
    """Other callbacks' batch hooks between the steps (EMA, image logging, a checkpoint every step)."""
    step_ms, callbacks_ms = run.steady(names.TRAIN_STEP_MS), run.steady(names.TRAIN_CALLBACKS_MS)
    if not step_ms or callbacks_ms is None:
        return NotAssessed("no callback times: timing off, or no batch after the warmup")
    share = callbacks_ms / step_ms
    if share < CALLBACKS_SHARE:
        return None
    named = (
        (run.sections.get("Step time and memory") or {}).get("data", {}).get("other callbacks between steps (sampled)")
    )
    which = f": {named}" if named else ""
    return Verdict(
        "callback-bound",
        "callback-bound",
        "high" if share >= CALLBACKS_SHARE_HIGH else "medium",
        f"{share:.0%} of training step time is spent in other callbacks' batch hooks ({callbacks_ms:.1f} of "
        f"{step_ms:.1f} ms per batch{which})",
        "Callbacks run on the training thread between the steps: the loop waits for them every batch.",
        "Make them cheaper or rarer: log images, run EMA updates and validation metrics every N batches, save "
        "checkpoints every N steps (ModelCheckpoint(every_n_train_steps=...)), move I/O to a background thread.",
    )


def slow_rank(run: RunData) -> Outcome:
    """The rank the others wait for, from each rank's wait per optimizer step (see docs/metrics.md)."""
    straggler_ms = run.steady(names.TRAIN_STRAGGLER_MS)
    if straggler_ms is None:
        ranks = (run.sections.get("Ranks") or {}).get("data") or {}
        assessed = str(ranks.get("collective wait") or "")
        if assessed.startswith("not"):
            return NotAssessed(assessed.removeprefix("not assessed: "))
        world = int(run.environment.get("world_size") or 1)
        if world > 1:  # a run that ended before its ranks exchanged their waits: not "one rank"
            return NotAssessed(f"only rank 0 reported, the waits of the {world} ranks were never exchanged")
        return NotAssessed("one rank")
    step_ms = run.steady(names.TRAIN_STEP_MS) or 0.0
    accumulate = int(run.environment.get("accumulate_grad_batches") or 1)
    optimizer_step_ms = step_ms * accumulate
    share = straggler_ms / optimizer_step_ms if optimizer_step_ms else 0.0
    if share < STRAGGLER_SHARE:
        return None
    rank = run.last(names.SUMMARY_TRAIN_SLOWEST_RANK)
    which = f"rank {rank:.0f}" if rank is not None else "one rank"
    hosts = run.environment.get("hosts") or []
    if rank is not None and int(rank) < len(hosts):
        which += f" on {hosts[int(rank)]}"
    data_rank = run.last(names.SUMMARY_TRAIN_DATALOADER_SLOWEST_RANK)
    data_max, data_mean = run.steady(names.TRAIN_DATALOADER_WAIT_MS_MAX), run.steady(names.TRAIN_DATALOADER_WAIT_MS)
    world = int(run.environment.get("world_size") or 2)
    extra_data_ms = (data_max - data_mean) * world / (world - 1) * accumulate if data_max and data_mean else 0.0
    by_data = data_rank == rank and extra_data_ms >= DATA_EXPLAINS_STRAGGLER * straggler_ms
    cause = (
        f"; its own data wait explains it ({extra_data_ms:.1f} ms more per optimizer step than the others)"
        if by_data
        else "; its data loading does not explain it"
    )
    per_step = "optimizer step" if accumulate > 1 else "step"
    spread_ms = _step_spread_ms(run) * accumulate
    if share < STRAGGLER_SHARE_HIGH and straggler_ms < STRAGGLER_ABOVE_SPREAD * spread_ms:
        return NotAssessed(
            f"the other ranks waited {share:.0%} of a {per_step} for {which}, less than the {per_step} time's own "
            f"spread between log intervals ({spread_ms:.1f} ms): not told apart from noise on the node; measure "
            "more steps on quieter nodes"
        )
    beside_startup = _share_beside_startup(run)
    if share < STRAGGLER_SHARE_HIGH and beside_startup >= STARTUP_COVERS_TYPICAL:
        return NotAssessed(
            f"the other ranks waited {share:.0%} of a {per_step} for {which}, but {beside_startup:.0%} of the measured "
            "training ran beside the profiler's own start-up (its MLflow sender importing MLflow), which can cost a "
            "rank that much on busy cores: measure more steps, or build the callbacks before the model"
        )
    return Verdict(
        "slow-rank",
        "slow rank",
        "high" if share >= STRAGGLER_SHARE_HIGH else "medium",
        f"the other ranks wait {straggler_ms:.1f} ms per {per_step} for {which} ({share:.0%} of the "
        f"{optimizer_step_ms:.1f} ms {per_step}){cause}",
        "Every collective waits for the slowest rank: the others idle, and their wait shows as communication.",
        (
            f"Look at the input pipeline of {which}: its data shard and storage, the DataLoader workers on its node."
            if by_data
            else f"Look at {which}: its node's GPU clocks, temperature and utilisation (system metrics), other "
            "jobs on the node; even out per-rank work (sequence lengths, padding)."
        ),
    )


def _step_spread_ms(run: RunData) -> float:
    """The median absolute deviation of the training step time over the log intervals; 0 with too few of them."""
    values = run.series(names.TRAIN_STEP_MS)[1]
    if len(values) < SPREAD_MIN_INTERVALS:
        return 0.0
    middle = median(values)
    return median(abs(value - middle) for value in values)


def _share_beside_startup(run: RunData) -> float:
    """The share of the measured training that ran beside the profiler's own start-up (the Throughput section's
    `train/startup_overlap_s` of `train/measured_s`); 0 when none did."""
    data = (run.sections.get("Throughput") or {}).get("data") or {}
    overlap_s, measured_s = data.get("train/startup_overlap_s"), data.get("train/measured_s")
    if not isinstance(overlap_s, int | float) or not isinstance(measured_s, int | float) or measured_s <= 0:
        return 0.0
    return min(1.0, overlap_s / measured_s)


def memory_use(run: RunData) -> Outcome:
    """Near the limit (risk of OOM, allocator retries) or plenty of headroom (room for a larger batch)."""
    capacity = run.device_memory_mb()
    if not run.on_gpu or not capacity:
        return NotAssessed("no CUDA device memory")
    profiled = run.profiled_memory()
    allocated = max(run.summary(names.PEAK_ALLOCATED_MB) or 0.0, profiled.get("peak_allocated_mb", 0.0))
    reserved = max(run.summary(names.PEAK_RESERVED_MB) or 0.0, profiled.get("peak_reserved_mb", 0.0))
    if not allocated:
        return NotAssessed("no peak memory measured: timing off")
    used = max(allocated, reserved) / capacity
    trouble = int(profiled.get("alloc_retries", 0) + profiled.get("ooms", 0))
    if used >= MEMORY_NEAR_LIMIT or trouble:
        retries = f"; {trouble} allocation retries or OOMs in profiled steps" if trouble else ""
        return Verdict(
            "memory-near-limit",
            "memory near the limit",
            "high" if trouble else "medium",
            f"peak reserved {_size(reserved)} of {_size(capacity)} ({reserved / capacity:.0%}), "
            f"peak allocated {_size(allocated)}{retries}",
            "A longer sequence or a larger batch will run out of memory; allocator retries (free and retry) "
            "already slow steps down when they happen.",
            "Activation checkpointing of the largest blocks, bf16 mixed precision, a smaller micro-batch with "
            "gradient accumulation, or shard weights and optimizer state (FSDP); against fragmentation set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        )
    if allocated / capacity > MEMORY_HEADROOM:
        return None
    return Verdict(
        "memory-headroom",
        "memory headroom",
        "info",
        f"peak allocated {_size(allocated)} of {_size(capacity)} ({allocated / capacity:.0%})",
        "Most of the device memory is unused: the GPU could get more work per step.",
        f"Raise the batch size ({_batch_factor(capacity / allocated)} where activations dominate; weights and "
        "optimizer state do not grow) and scale the learning rate, or turn off activation checkpointing if it is on.",
    )


def low_mfu(run: RunData) -> Outcome:
    mfu = run.steady(names.TRAIN_MFU)
    if mfu is None:
        return NotAssessed("FLOPs per sample or the device's peak unknown, see throughput.device_peak_flops")
    if mfu >= MFU_LOW:
        return None
    precision = str(run.environment.get("precision") or run.header.get("precision") or "")
    if precision.startswith("32"):
        next_step = (
            'Train in bf16 mixed precision (Trainer(precision="bf16-mixed")): fp32 leaves the tensor cores idle; '
            "then fix the limiters above."
        )
    else:
        next_step = (
            "Fix the limiters above first; then torch.compile to fuse memory-bound kernels, a fused optimizer "
            "(AdamW(fused=True)), attention through scaled_dot_product_attention, matmul sizes in multiples of 64."
        )
    return Verdict(
        "low-mfu",
        "low MFU",
        "high" if mfu < MFU_VERY_LOW else "medium",
        f"MFU {mfu * 100:.2g}% of the dense {precision or 'training-precision'} peak (below {MFU_LOW:.0%})",
        "The device's arithmetic is mostly unused: overheads and memory-bound kernels take the time.",
        next_step,
    )


CHECKS: dict[str, Callable[[RunData], Outcome]] = {
    "dataloader wait": dataloader_bound,
    "callbacks": callback_bound,
    "epoch starts": slow_epoch_starts,
    "slow stretches": slow_stretches,
    "host wait": host_bound,
    "communication": communication_bound,
    "rank balance": slow_rank,
    "memory": memory_use,
    "MFU": low_mfu,
}


def assess(run: RunData) -> dict[str, Outcome]:
    """Every check's outcome; a check that fails on odd data is reported as not assessed, never raised."""
    outcomes: dict[str, Outcome] = dict(postmortems(run))  # what stopped the run, first: the report leads with it
    for name, check in CHECKS.items():
        try:
            outcomes[name] = check(run)
        except Exception as error:
            outcomes[name] = NotAssessed(f"could not assess: {type(error).__name__}: {error}")
    return outcomes


def diagnose(run: RunData) -> list[Verdict]:
    """The verdicts that fire, most severe first (check order within a severity)."""
    return fired(assess(run))


def render_section(outcomes: dict[str, Outcome]) -> ReportSection:
    """The report's opening section: the verdicts with their next steps, and what could not be assessed."""
    verdicts = fired(outcomes)
    not_assessed = {name: o.reason for name, o in outcomes.items() if isinstance(o, NotAssessed)}
    rows: list[list[str]] = []
    for verdict in verdicts:
        rows += [
            [f"[{verdict.severity}] {verdict.name}: {verdict.value}"],
            [f"    {verdict.message}"],
            [f"    Next: {verdict.next_step}"],
        ]
    if not verdicts:
        checked = [name for name in outcomes if name not in not_assessed]
        rows.append([f"No limiter found (checked with data: {', '.join(checked) or 'none'})."])
    note = "Checked: " + ", ".join(outcomes) + ". Thresholds: docs/reports.md."
    if not_assessed:
        note += " Not assessed: " + "; ".join(f"{name} ({reason})" for name, reason in not_assessed.items()) + "."
    data = {"verdicts": [asdict(v) for v in verdicts], "not_assessed": not_assessed}
    return ReportSection(TITLE, [""], rows, data, note)


def fired(outcomes: dict[str, Outcome]) -> list[Verdict]:
    """The verdicts among the outcomes, most severe first."""
    verdicts = [outcome for outcome in outcomes.values() if isinstance(outcome, Verdict)]
    return sorted(verdicts, key=lambda v: SEVERITY_ORDER.index(v.severity))


def _size(mb: float) -> str:
    return f"{mb / 1e3:.1f} GB" if mb >= 1e3 else f"{mb:.0f} MB"


def _batch_factor(free_ratio: float) -> str:
    """How much larger a batch fits, said plainly (a model using 0.1% of the GPU does not fit 1000x)."""
    factor = MEMORY_NEAR_LIMIT * free_ratio
    return f"up to about {factor:.1f}x" if factor <= MAX_BATCH_FACTOR else f"{MAX_BATCH_FACTOR}x or more"


def _data_wait_share(run: RunData) -> float:
    step_ms, wait_ms = run.steady(names.TRAIN_STEP_MS), run.steady(names.TRAIN_DATALOADER_WAIT_MS)
    return wait_ms / step_ms if step_ms and wait_ms else 0.0


def _by_rank(run: RunData, name: str) -> dict[int, float]:
    """A per-rank value of the training windows (HTA's, else the window summary's), averaged over windows."""
    values: dict[int, list[float]] = {}
    for value in run.analysis_values()[1]:
        if value.rank is not None and value.name == name:
            values.setdefault(value.rank, []).append(value.value)
    return {rank: mean(found) for rank, found in values.items()}
