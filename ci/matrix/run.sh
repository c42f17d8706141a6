#!/usr/bin/env bash
# The version matrix (docs/versions.md): the tests marked `stack` (every path that depends on the version of torch,
# Lightning or MLflow) on the stacks users run besides the newest one that `make test` covers:
#   floor  - the oldest versions pyproject.toml declares, on Python 3.10 (ci/matrix/floor.txt, setup.sh here);
#   anemoi - anemoi-training 0.17.1 installed as its users install it, with the torch it resolves (ci/anemoi/setup.sh).
# Environments are built once and cached under ~/.cache/anemoi-profiler; the tests import the checkout's src/.
# `bash ci/matrix/run.sh [floor|anemoi ...]`; extra pytest arguments in PYTEST_ARGS.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
sets=("$@")
[[ ${#sets[@]} -gt 0 ]] || sets=(floor anemoi)
# Only the files with `stack` tests are collected: the others may import what an older Lightning lacks.
mapfile -t files < <(grep -rl --include="test_*.py" "pytest.mark.stack" tests | sort)
for set in "${sets[@]}"; do
    case "$set" in
        floor) env_dir="$(bash "$here/setup.sh")" ;;
        anemoi) env_dir="$(bash "$repo/ci/anemoi/setup.sh")" ;;
        *) echo "matrix: unknown set $set (floor, anemoi)" >&2; exit 2 ;;
    esac
    extra=()
    [[ -d $env_dir/sqlalchemy21 ]] && extra=(ANEMOI_PROFILER_SQLALCHEMY21="$env_dir/sqlalchemy21")
    echo "matrix: $set: $("$env_dir/bin/python" -c 'import sys, torch, lightning, mlflow; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, Lightning {lightning.__version__}, MLflow {mlflow.__version__}")' 2>/dev/null || "$env_dir/bin/python" -c 'import sys, torch, pytorch_lightning, mlflow; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, pytorch_lightning {pytorch_lightning.__version__}, MLflow {mlflow.__version__}")')"
    # Warnings stay warnings here: an older stack's deprecations are not ours to fix (`make test` keeps them errors).
    env PYTHONPATH="$repo/src" MLFLOW_DISABLE_TELEMETRY=true "${extra[@]}" \
        "$env_dir/bin/python" -m pytest -m stack -o filterwarnings= -p no:cacheprovider ${PYTEST_ARGS:--q} "${files[@]}"
done
