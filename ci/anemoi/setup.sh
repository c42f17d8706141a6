#!/usr/bin/env bash
# Builds (once) the anemoi-training environment that `make anemoi-e2e` and the version matrix run in, and prints its
# folder. anemoi-training is installed as its users install it (pip resolves its torch), then anemoi-profiler from
# this checkout with its dependencies; the tests and the trainings import the checkout's src/ first (PYTHONPATH), so
# the cached copy only brings the dependencies. The environment is cached under
# ~/.cache/anemoi-profiler/anemoi-env-<hash of this script, its pins and pyproject.toml's dependencies>, so a later run (CI in a fresh
# clone) reuses it; a new machine builds it from PyPI. Fails loudly when the environment cannot be built.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
# pyproject.toml counts by its dependencies alone: a change elsewhere in it does not rebuild the environment.
deps="$(awk '/^dependencies = \[/,/^\]/; /^\[project.optional-dependencies\]/ {f = 1; next} /^\[/ {f = 0} f' "$repo/pyproject.toml")"
hash="$( (cat "$here/setup.sh" "$here/requirements.txt"; echo "$deps") | sha256sum | cut -c1-12)"
env_dir="${ANEMOI_ENV_CACHE:-$HOME/.cache/anemoi-profiler}/anemoi-env-$hash"
if [[ -f "$env_dir/.complete" ]]; then
    echo "$env_dir"
    exit 0
fi
echo "anemoi-e2e: building $env_dir (once; a few minutes)" >&2
rm -rf "$env_dir"
mkdir -p "$(dirname "$env_dir")"
"$python" -m venv "$env_dir"
pip=("$env_dir/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip >&2
"${pip[@]}" -r "$here/requirements.txt" >&2
"${pip[@]}" "$repo[hta]" >&2
# Proof that the set imports, torchvision's operators included (timm imports torchvision), and that pip kept
# anemoi's torch.
"$env_dir/bin/python" -c "
import torch, torchvision.ops, timm, anemoi.training, anemoi.models, anemoi.graphs, anemoi.datasets, anemoi_profiler
from packaging.version import Version
assert Version(torch.__version__.split('+')[0]) < Version('2.11'), torch.__version__
" >&2
touch "$env_dir/.complete"
echo "$env_dir"
