"""The fault-injection DDP job the system tests run: a small model with flags that slow, stall or fail ranks.

Not an example to copy (that is `examples/ddp_train.py`): it exists so that tests can make stragglers, slow
dataloaders and failing ranks on demand. Lightning's own launcher (this script starts the other processes of
the node itself):

    python tests/helpers/fault_job.py --devices 2 --max-steps 50

torchrun, one launcher per node (here two "nodes" on one machine; on a cluster use the first node's address):

    torchrun --nproc_per_node 2 tests/helpers/fault_job.py --devices 2
    torchrun --nnodes 2 --nproc_per_node 1 --node_rank 0 --master_addr 127.0.0.1 --master_port 29500 \\
        tests/helpers/fault_job.py --devices 1 --num-nodes 2          # and the same with --node_rank 1

The job gets one run folder and one MLflow run (rank 0 creates both and tells the others), whatever the
launcher. Pass profiler options as `key=value` after the flags, e.g. `distributed.profiled_ranks=[1]`.
`--step-ms MS` makes every rank's training step wait MS milliseconds without using the CPU, as a step on a GPU
does; `--slow-rank R --slow-ms MS` makes one rank sleep that much longer in every training step (a straggler the
others wait for; from step N on with `--slow-from-step N`), and
`--slow-data-rank R --slow-data-ms MS` makes one rank's dataloader slow; `--fail-on-rank R --fail-at-step N` makes
one rank raise, to see the job end instead of hanging; `--kill-rank R --kill-at-step N` makes one rank SIGKILL
itself (what the kernel's OOM killer does; with `--kill-by-oom` it allocates until the OOM killer ends it); with
`DDP_TRAIN_DUMP_STACKS_AFTER_S=S` in the environment every process prints its Python stacks after S seconds,
which shows where a process waits if it ever does.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from anemoi_profiler import ProfilerConfig, build_callbacks
from anemoi_profiler.tracking import artifact_location_for, resolve_tracking_uri

FEATURES = 32


class SmallRegressor(pl.LightningModule):
    """A two-layer MLP; every rank sleeps `step_s` in every training step and `slow_rank` `slow_s` more;
    `fail_on_rank` raises at `fail_at_step`."""

    def __init__(
        self,
        width: int = 64,
        fail_on_rank: int | None = None,
        fail_at_step: int = 0,
        step_s: float = 0.0,
        slow_rank: int | None = None,
        slow_s: float = 0.0,
        slow_from_step: int = 0,
        kill_rank: int | None = None,
        kill_at_step: int = 0,
        kill_mark: str | None = None,
        kill_by_oom: bool = False,
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, 1))
        self.fail_on_rank = fail_on_rank
        self.fail_at_step = fail_at_step
        self.step_s = step_s
        self.slow_rank = slow_rank
        self.slow_s = slow_s
        self.slow_from_step = slow_from_step
        self.kill_rank = kill_rank
        self.kill_at_step = kill_at_step
        self.kill_mark = kill_mark
        self.kill_by_oom = kill_by_oom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.fail_on_rank and self.global_step >= self.fail_at_step:
            raise RuntimeError(f"injected failure on rank {self.global_rank} at step {self.global_step}")
        if self.global_rank == self.kill_rank and self.global_step >= self.kill_at_step:
            if self.kill_mark:
                with open(self.kill_mark, "w") as mark:
                    mark.write(repr(time.time()))
            hog = []
            while self.kill_by_oom:  # until the kernel's OOM killer ends it (run it in a memory-limited cgroup)
                hog.append(b"\1" * (64 << 20))
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer does: no Python runs after it
        if self.step_s:
            time.sleep(self.step_s)
        if self.global_rank == self.slow_rank and self.global_step >= self.slow_from_step:
            time.sleep(self.slow_s)
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def synthetic_data(samples: int, seed: int) -> TensorDataset:
    """The same random regression data on every rank; Lightning's DistributedSampler splits it."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class SlowWorkerStart:
    """A DataLoader `worker_init_fn` that takes `delay_s`: a worker opening a large dataset."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.delay_s)


class SlowBatches:
    """Collates like the default, `delay_s` slower on global rank `rank`: one rank's slow input pipeline."""

    def __init__(self, rank: int, delay_s: float) -> None:
        self.rank = rank
        self.delay_s = delay_s

    def __call__(self, samples: list[Any]) -> Any:
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == self.rank:
            time.sleep(self.delay_s)
        return default_collate(samples)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help="profiler YAML file")
    source.add_argument("--preset", choices=["simple", "detailed"], help="profiler preset (default: simple)")
    parser.add_argument("--devices", type=int, default=2, help="processes per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="ddp", help="Lightning strategy name (default: ddp)")
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank and step")
    parser.add_argument("--width", type=int, default=64, help="hidden width of the MLP (more compute per step)")
    parser.add_argument("--val-batches", type=int, default=4, help="validation batches per rank at the epoch end")
    parser.add_argument("--output-dir", help="profiler output_dir (run folders and the embedded mlflow.db)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: the embedded sqlite store)")
    parser.add_argument("--mlflow-logger", action="store_true", help="also log the loss with an MLFlowLogger")
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step (gradient accumulation)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="every rank sleeps this long per training step")
    parser.add_argument("--slow-rank", type=int, help="global rank that sleeps longer in every training step")
    parser.add_argument("--slow-ms", type=float, default=60.0, help="how long --slow-rank sleeps per step")
    parser.add_argument("--slow-from-step", type=int, default=0, help="first step in which --slow-rank sleeps")
    parser.add_argument("--slow-data-rank", type=int, help="global rank whose dataloader is slow")
    parser.add_argument("--slow-data-ms", type=float, default=60.0, help="extra time per batch of --slow-data-rank")
    parser.add_argument(
        "--same-samples", action="store_true", help="every rank trains on every sample (no DistributedSampler)"
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs the max_steps are split into")
    parser.add_argument(
        "--worker-start-ms",
        type=float,
        help="give the training DataLoader one worker, started again every epoch, that takes this long to start",
    )
    parser.add_argument("--save-weights", help="rank 0 saves the trained weights to this file (torch.save)")
    parser.add_argument("--fail-on-rank", type=int, help="global rank that raises in training_step")
    parser.add_argument("--fail-at-step", type=int, default=5, help="step at which --fail-on-rank raises")
    parser.add_argument("--kill-rank", type=int, help="global rank that SIGKILLs itself in training_step")
    parser.add_argument("--kill-at-step", type=int, default=25, help="step at which --kill-rank is killed")
    parser.add_argument(
        "--kill-by-oom", action="store_true", help="--kill-rank allocates host memory until the OOM killer ends it"
    )
    parser.add_argument("--kill-mark", help="file where --kill-rank writes the time of its kill (time.time())")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="profiler config overrides")
    return parser.parse_args(argv)


def profiler_config(args: argparse.Namespace) -> ProfilerConfig:
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.tracking_uri:
        overrides.append(f"tracking.uri={args.tracking_uri}")
    return ProfilerConfig.load(args.config or args.preset or "simple", overrides)


def will_be_global_rank_zero() -> bool:
    """Whether this process becomes global rank 0, read from the launcher's environment before the Trainer exists.

    torchrun and SLURM set RANK/SLURM_PROCID; Lightning's launcher starts as local rank 0 of its node and sets
    LOCAL_RANK in the processes it starts.
    """
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return int(os.environ.get("NODE_RANK", 0)) == 0 and int(os.environ.get("LOCAL_RANK", 0)) == 0


def mlflow_logger(config: ProfilerConfig) -> MLFlowLogger | bool:
    """A logger on the profiler's store, on rank 0 only; the profiler writes into the logger's run.

    MLFlowLogger opens its store when it is built. Under torchrun every process builds it at the same moment,
    and on a new sqlite file they all create the tables at once: all but one fail (alembic CommandError).
    Rank 0 alone logs to MLflow anyway, and the profiler tells the other ranks its run id.
    """
    if not will_be_global_rank_zero():
        return False
    tracking_uri = resolve_tracking_uri(config.tracking.uri, None, config.output_dir)
    return MLFlowLogger(
        experiment_name=config.tracking.experiment,
        tracking_uri=tracking_uri,
        artifact_location=artifact_location_for(tracking_uri),
    )


def main(argv: list[str] | None = None) -> None:
    dump_after_s = os.environ.get("DDP_TRAIN_DUMP_STACKS_AFTER_S")
    if dump_after_s:
        faulthandler.dump_traceback_later(float(dump_after_s), exit=False)
    args = parse_args(argv)
    config = profiler_config(args)
    torch.manual_seed(0)
    world_size = args.devices * args.num_nodes
    # `epochs` epochs of max_steps batches per rank in all, each followed by one validation run.
    batches = args.max_steps * args.accumulate // args.epochs
    collate = SlowBatches(args.slow_data_rank, args.slow_data_ms / 1000) if args.slow_data_rank is not None else None
    train_set = synthetic_data(batches * args.batch_size * world_size, seed=0)
    workers: dict[str, Any] = {}
    if args.worker_start_ms is not None:
        workers = {"num_workers": 1, "worker_init_fn": SlowWorkerStart(args.worker_start_ms / 1000)}
    train = DataLoader(train_set, args.batch_size, collate_fn=collate, **workers)
    val = DataLoader(synthetic_data(args.val_batches * args.batch_size * world_size, seed=1), args.batch_size)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy=args.strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate,
        use_distributed_sampler=not args.same_samples,
        limit_val_batches=args.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=config.log_every_n_steps,
        callbacks=build_callbacks(config),
        logger=mlflow_logger(config) if args.mlflow_logger else False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=sys.stdout.isatty(),
    )
    model = SmallRegressor(
        width=args.width,
        fail_on_rank=args.fail_on_rank,
        fail_at_step=args.fail_at_step,
        step_s=args.step_ms / 1000,
        slow_rank=args.slow_rank,
        slow_s=args.slow_ms / 1000,
        slow_from_step=args.slow_from_step,
        kill_rank=args.kill_rank,
        kill_at_step=args.kill_at_step,
        kill_mark=args.kill_mark,
        kill_by_oom=args.kill_by_oom,
    )
    trainer.fit(model, train, val)
    if args.save_weights and trainer.global_rank == 0:
        torch.save(model.state_dict(), args.save_weights)


if __name__ == "__main__":
    main()
