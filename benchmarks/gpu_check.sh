#!/usr/bin/env bash
# The GPU check: everything benchmarks/run.py measures, on one CUDA device with the H200 baseline model
# (8-layer transformer, d=1024, bf16-mixed), plus the detailed preset end to end (CUDA memory reports,
# memory snapshot and timeline, NVML system metrics, HTA on the traces it wrote). Meant to finish in under
# 5 minutes on an H200 with torch and Lightning preinstalled.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine
#   DRY_RUN=1 bash benchmarks/gpu_check.sh  # anywhere, on CPU, tiny sizes (tests/system/test_benchmarks.py)
#
# Packages the machine lacks (mlflow, omegaconf, torchinfo, traceinsight, ... see docs/benchmarks.md)
# travel as wheels in .whl/ and are installed into /tmp/site; without them the parts that need them are
# skipped with a note in results.json. Results go to $OUT (default ./benchmark_out): results.json,
# run.log and a few report files, at most one folder deep.
#
# CHECKS (comma list; default bench,triggers,window_summary; a dry run does bench only):
#   bench           benchmarks/run.py: the overhead table, throughput accuracy, traces, reports, HTA, detailed
#   triggers        benchmarks/gpu_triggers_check.py: armed-trigger cost, a memory-triggered window's CUDA
#                   snapshot, a requested window, a Lightning window's summary and its agreement with HTA
#   window_summary  benchmarks/gpu_window_summary_check.py: the in-process summary of a CUDA window beside
#                   torch's export of it, `summarize` and HTA on that export (benchmarks/hta_agreement.py)
# Settings: TRIGGER_PARTS (gpu_triggers_check.py --parts), PYTHON (python3), REPS (repetitions of the overhead table), SECTIONS (comma list, see run.py
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
if [ "${DRY_RUN:-0}" = "1" ]; then checks="${CHECKS:-bench}"; else checks="${CHECKS:-bench,triggers,window_summary}"; fi
status=0

if [[ ",$checks," == *,triggers,* ]]; then
    note "triggers: armed cost, memory trigger, request, a Lightning window's summary"
    "$PYTHON" benchmarks/gpu_triggers_check.py "$OUT/triggers" --keep-traces "$work/lightning_traces" \
        ${REPS:+--repetitions "$REPS"} ${TRIGGER_PARTS:+--parts "$TRIGGER_PARTS"} 2>&1 | tee -a "$OUT/run.log" \
        || status=1
    window="$(find "$work/lightning_traces" -mindepth 2 -maxdepth 2 -type d -name 'window_*' 2>/dev/null | sort | head -1)"
    [ -n "$window" ] && "$PYTHON" benchmarks/hta_agreement.py "$window" --json "$OUT/lightning_agreement.json" 2>&1 \
        | tail -25 | tee -a "$OUT/run.log"
fi

if [[ ",$checks," == *,window_summary,* ]]; then
    note "window_summary: in process beside torch's export, summarize and HTA"
    "$PYTHON" benchmarks/gpu_window_summary_check.py "$OUT/ws" 2>&1 | tee -a "$OUT/run.log" || status=1
    mkdir -p "$work/ws_trace" && cp "$OUT/ws/rank0.pt.trace.json.gz" "$work/ws_trace/" \
        && "$PYTHON" benchmarks/hta_agreement.py "$work/ws_trace" --json "$OUT/ws_agreement.json" 2>&1 \
        | tee -a "$OUT/run.log"
fi

if [[ ",$checks," == *,bench,* ]]; then
    timeout --signal=INT --kill-after=20 "${BENCH_TIMEOUT_S:-280}" \
        "$PYTHON" benchmarks/run.py "${args[@]}" --out "$OUT/results.json" --work-dir "$work" 2>&1 \
        | tee -a "$OUT/run.log"
    bench_status=${PIPESTATUS[0]}
    [ "$bench_status" = 124 ] && note "run.py stopped after ${BENCH_TIMEOUT_S:-280} s; results.json holds the sections it finished"
    [ "$bench_status" != 0 ] && status=$bench_status

    # A few files of the detailed preset's run folder, for reading without the work folder.
    run_dir="$(find "$work/runs" -maxdepth 1 -mindepth 1 -type d 2>/dev/null | sort | while read -r d; do
        [ -f "$d/memory_report.txt" ] && [ -f "$d/model_summary.txt" ] && echo "$d"; done | tail -1)"
    if [ -n "$run_dir" ]; then
        for name in report.txt memory_report.txt time_report.csv; do
            [ -f "$run_dir/$name" ] && cp "$run_dir/$name" "$OUT/detailed_$name"
        done
        [ -f "$run_dir/hta/summary.json" ] && cp "$run_dir/hta/summary.json" "$OUT/detailed_hta_summary.json"
    fi
fi
if [ "${KEEP_WORK:-0}" = "1" ]; then note "work folder kept: $work"; else rm -rf "$work"; fi
exit "$status"
