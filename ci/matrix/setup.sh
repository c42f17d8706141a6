#!/usr/bin/env bash
# Builds (once) the environment of the floor set of the version matrix (floor.txt: the oldest versions pyproject.toml
# declares, on Python 3.10) and prints its folder. Cached under
# ~/.cache/anemoi-profiler/floor-env-<hash of this script, its pins and pyproject.toml's dependencies>, as ci/anemoi/setup.sh does;
# anemoi-profiler's own dependencies come from the checkout (pip keeps the pinned versions), the tests import its
# src/ first. Fails loudly when the environment cannot be built.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON310:-}"
if [[ -z $python ]]; then
    for candidate in python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python3.10; do
        if "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 10)" 2>/dev/null; then
            python="$candidate"
            break
        fi
    done
fi
[[ -n $python ]] || { echo "matrix: no Python 3.10 found (set PYTHON310)" >&2; exit 1; }
# pyproject.toml counts by its dependencies alone: a change elsewhere in it does not rebuild the environment.
deps="$(awk '/^dependencies = \[/,/^\]/; /^\[project.optional-dependencies\]/ {f = 1; next} /^\[/ {f = 0} f' "$repo/pyproject.toml")"
hash="$( (cat "$here/setup.sh" "$here/floor.txt"; echo "$deps") | sha256sum | cut -c1-12)"
env_dir="${ANEMOI_ENV_CACHE:-$HOME/.cache/anemoi-profiler}/floor-env-$hash"
if [[ -f "$env_dir/.complete" ]]; then
    echo "$env_dir"
    exit 0
fi
echo "matrix: building $env_dir (once; a few minutes)" >&2
rm -rf "$env_dir"
mkdir -p "$(dirname "$env_dir")"
"$python" -m venv "$env_dir"
pip=("$env_dir/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip >&2
"${pip[@]}" -r "$here/floor.txt" "$repo[hta]" >&2
# SQLAlchemy 2.1, what pip picks beside an MLflow 2.x client today, in a folder of its own: put first on the path of
# one test's subprocess (tests/unit/test_mlflow_versions.py), it checks the clear error of that combination.
"${pip[@]}" --no-deps --target "$env_dir/sqlalchemy21" "sqlalchemy==2.1.*" >&2
"$env_dir/bin/python" -c "
import torch, lightning, pytorch_lightning, mlflow, anemoi_profiler
assert torch.__version__.startswith('2.4.'), torch.__version__
assert mlflow.__version__.startswith('2.'), mlflow.__version__
" >&2
touch "$env_dir/.complete"
echo "$env_dir"
