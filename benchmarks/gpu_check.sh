#!/usr/bin/env bash
# The GPU check: everything benchmarks/run.py measures, on one CUDA device with the H200 baseline model
# (8-layer transformer, d=1024, bf16-mixed), plus the detailed preset end to end (CUDA memory reports,
# memory snapshot and timeline, NVML system metrics, HTA on the traces it wrote). Meant to finish in under
# 5 minutes on an H200 with torch and Lightning preinstalled.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine
#   DRY_RUN=1 bash benchmarks/gpu_check.sh  # anywhere, on CPU, tiny sizes (tests/test_benchmarks.py)
#
# Packages the machine lacks (mlflow, omegaconf, torchinfo, traceinsight, ... see docs/benchmarks.md)
# travel as wheels in .whl/ and are installed into /tmp/site; without them the parts that need them are
# skipped with a note in results.json. Results go to $OUT (default ./benchmark_out): results.json,
# run.log and a few report files, at most one folder deep.
#
# Settings: PYTHON (python3), REPS (repetitions of the overhead table), SECTIONS (comma list, see run.py
# --help), BENCH_TIMEOUT_S (run.py is stopped after it; 280), KEEP_WORK=1 keeps the work folder.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/benchmark_out}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true PYTHONUNBUFFERED=1
unset MLFLOW_TRACKING_URI

note() { echo "gpu_check: $*" | tee -a "$OUT/run.log"; }

if [ "${DRY_RUN:-0}" = "1" ]; then
    note "dry run: CPU, --quick sizes; .whl/ is not installed (it holds wheels for the GPU machine's Python)"
    args=(--quick --device cpu)
else
    if compgen -G ".whl/*.whl" >/dev/null; then
        if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl; then
            export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
        else
            note "installing .whl/*.whl failed: parts that need those packages are skipped"
        fi
    else
        note "no .whl/ folder: parts that need packages missing here are skipped (see meta.missing_optional)"
    fi
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
        | tee -a "$OUT/run.log"
    args=(--device cuda)
fi
# The package from this checkout, whether or not it is installed.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

work="$(mktemp -d "${TMPDIR:-/tmp}/anemoi-gpu-check-XXXXXX")"
[ -n "${REPS:-}" ] && args+=(--repetitions "$REPS")
[ -n "${SECTIONS:-}" ] && args+=(--sections "$SECTIONS")

timeout --signal=INT --kill-after=20 "${BENCH_TIMEOUT_S:-280}" \
    "$PYTHON" benchmarks/run.py "${args[@]}" --out "$OUT/results.json" --work-dir "$work" 2>&1 \
    | tee -a "$OUT/run.log"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && note "run.py stopped after ${BENCH_TIMEOUT_S:-280} s; results.json holds the sections it finished"

# A few files of the detailed preset's run folder, for reading without the work folder.
run_dir="$(find "$work/runs" -maxdepth 1 -mindepth 1 -type d 2>/dev/null | sort | while read -r d; do
    [ -f "$d/memory_report.txt" ] && [ -f "$d/model_summary.txt" ] && echo "$d"; done | tail -1)"
if [ -n "$run_dir" ]; then
    for name in report.txt memory_report.txt time_report.csv; do
        [ -f "$run_dir/$name" ] && cp "$run_dir/$name" "$OUT/detailed_$name"
    done
    [ -f "$run_dir/hta/summary.json" ] && cp "$run_dir/hta/summary.json" "$OUT/detailed_hta_summary.json"
fi
if [ "${KEEP_WORK:-0}" = "1" ]; then note "work folder kept: $work"; else rm -rf "$work"; fi
exit "$status"
