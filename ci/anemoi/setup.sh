#!/usr/bin/env bash
# Builds (once) the anemoi-training environment that `make anemoi-e2e` runs in and prints its folder.
# The environment is cached under ~/.cache/anemoi-profiler/anemoi-env-<hash of this script and its pins>, so a
# later run (CI in a fresh clone) reuses it; a new machine builds it from PyPI. anemoi-profiler itself is not in it:
# run.sh installs the checkout with --no-deps at each run. Fails loudly when the environment cannot be built.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
hash="$(cat "$here/setup.sh" "$here/requirements.txt" "$here/anemoi.txt" | sha256sum | cut -c1-12)"
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
"${pip[@]}" --no-deps -r "$here/anemoi.txt" >&2
# Proof that the set imports, torchvision's operators included (timm imports torchvision).
"$env_dir/bin/python" -c "import torchvision.ops, timm, anemoi.training, anemoi.models, anemoi.graphs, anemoi.datasets" >&2
touch "$env_dir/.complete"
echo "$env_dir"
