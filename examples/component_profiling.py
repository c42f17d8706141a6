"""Profile a LayerNorm on its own, eager and compiled, with the same reports as a training run.

    python examples/component_profiling.py --output-dir /tmp/component   # CPU; add --device cuda on a GPU machine
    anemoi-profiler component --config examples/component.yaml --output-dir /tmp/component

Each run writes a run folder with traces/component/window_<k>/rank0.pt.trace.json.gz, time_report.csv,
memory_report.txt and report.txt; compare the eager and compiled folders' time reports.
"""

from __future__ import annotations

import argparse

import torch

from anemoi_profiler import ProfilerConfig
from anemoi_profiler.component import profile_component


def layer_norm(width: int = 1024) -> torch.nn.Module:
    """The factory that `--target examples/component_profiling.py:layer_norm` calls."""
    return torch.nn.LayerNorm(width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--output-dir", default="profiler_runs/component", help="where the run folders go")
    args = parser.parse_args()
    config = ProfilerConfig.load(
        None,
        [
            f"output_dir={args.output_dir}",
            "tracking.enabled=false",
            "profiler.train.skip_first=3",  # the first calls compile (with torch.compile) and warm caches
            "profiler.train.wait=1",
            "profiler.train.warmup=1",
            "profiler.train.active=5",
        ],
    )
    for compile in (False, True):
        profile_component(
            layer_norm(args.width),
            input_shapes=[(64, 512, args.width)],
            dtype=args.dtype,
            device=args.device,
            config=config,
            compile=compile,
            backward=True,
        )


if __name__ == "__main__":
    main()
