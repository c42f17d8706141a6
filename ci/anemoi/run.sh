#!/usr/bin/env bash
# `make anemoi-e2e`: a real `anemoi-training train` with the profiler on the tiny dataset, in the environment of
# setup.sh (built once, then cached), checked by check_run.py against anemoi's MLflow store and an independent
# clock. Four runs: the simple preset (figures against the clock), the detailed one chosen on the command line
# (model summary, traces, reports), 2 CPU ranks in one model group, and anemoi's online mode with a real
# MLflow server on 127.0.0.1. Fails loudly when the environment cannot be built, a training fails or hangs, or a
# check fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
env_dir="$(bash "$here/setup.sh")"
work="${ANEMOI_E2E_DIR:-$repo/build/anemoi-e2e}"
rm -rf "$work"
mkdir -p "$work"
cd "$work"  # the training's working directory: check_run.py makes sure nothing lands in ./mlruns here

# anemoi-profiler from this checkout; the clock callback of the check beside it.
export PYTHONPATH="$repo/src:$here${PYTHONPATH:+:$PYTHONPATH}"
export MLFLOW_DISABLE_TELEMETRY=true
# anemoi's offline mode writes MLflow's file store, which MLflow >= 3.13 refuses unless allowed (docs/anemoi.md).
export MLFLOW_ALLOW_FILE_STORE=true

"$env_dir/bin/python" "$here/make_dataset.py" "$work/data" >"$work/make_dataset.log" 2>&1 \
    || { tail -30 "$work/make_dataset.log"; exit 1; }

# anemoi's online mode: a real MLflow tracking server on this machine, for the last run.
port="$("$env_dir/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
server="http://127.0.0.1:$port"
"$env_dir/bin/mlflow" server --host 127.0.0.1 --port "$port" --workers 1 --backend-store-uri "sqlite:///$work/server.db" \
    --default-artifact-root "$work/server_artifacts" >"$work/mlflow_server.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT

# name, then the overrides of that run (the profiler is callback 1 of e2e.yaml, after the clock)
runs=(
    "simple|diagnostics.callbacks.1.preset=simple"
    "detailed|diagnostics.callbacks.1.preset=detailed"
    # 2 CPU ranks in one model group of 2 (DDPGroupStrategy): the grid sharded, every sample on both ranks
    "model_group|system.hardware.num_gpus_per_node=2 system.hardware.num_gpus_per_model=2 training.max_epochs=2 dataloader.batch_size.training=1 dataloader.batch_size.validation=1"
    "online|diagnostics.log.mlflow.offline=False diagnostics.log.mlflow.tracking_uri=$server"
)
for entry in "${runs[@]}"; do
    name="${entry%%|*}"
    read -r -a overrides <<<"${entry#*|}"
    out="$work/$name"
    tracking="file:$out/logs/mlflow"
    if [[ $name == online ]]; then
        tracking="$server"
        "$env_dir/bin/python" -c "import sys, time, urllib.request as r
for _ in range(120):
    try:
        sys.exit(r.urlopen('$server/health', timeout=2).status != 200)
    except OSError:
        time.sleep(0.5)
sys.exit(1)" || { tail -20 "$work/mlflow_server.log"; echo "anemoi-e2e: the MLflow server did not start"; exit 1; }
    fi
    echo "anemoi-e2e: anemoi-training train, $name"
    start=$SECONDS
    if ! timeout 900 "$env_dir/bin/anemoi-training" train --config-path="$here/config" --config-name=e2e \
        system.input.dataset="$work/data/tiny.zarr" system.output.root="$out" diagnostics.enable_progress_bar=False \
        "${overrides[@]}" >"$work/train_$name.log" 2>&1; then
        tail -40 "$work/train_$name.log"
        echo "anemoi-e2e: training $name failed or hung (log: $work/train_$name.log)"
        exit 1
    fi
    echo "anemoi-e2e: trained in $((SECONDS - start)) s"
    extra=()
    [[ $name == detailed ]] && extra=(--detailed)
    "$env_dir/bin/python" "$here/check_run.py" --tracking-uri "$tracking" --clock "$out/batch_clock.json" \
        --workdir "$work" --profiler-dir "$out/profiler" "${extra[@]}"
done
