# Two entry points for a fresh machine (see README): `make demo` and `make test`. The test tiers (tests/README.md):
# `make check` after every edit, `make test` before a push, `make soak` in CI after it.
# Both install with constraints.txt: the torch version of the tests, from pip's configured indexes (README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MLFLOW_DISABLE_TELEMETRY := true
export NO_MKDOCS_2_WARNING := 1

.PHONY: demo check test soak lint docs clean anemoi-e2e matrix

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-base: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-base
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,hta]"
	touch $@

# hydra-core 1.3 requires omegaconf < 2.4, the dev venv has 2.4: both are tested. The pair (and antlr 4.9, which
# both need) goes into a folder of its own, put first on PYTHONPATH by the tests that run in a subprocess
# (tests/system/test_hydra.py); everything else comes from the venv. Made once, then kept until `make clean`.
OMEGACONF23 := $(VENV)/omegaconf23
export ANEMOI_PROFILER_OMEGACONF23 := $(abspath $(OMEGACONF23))

$(OMEGACONF23)/.installed: | $(BIN)/python
	rm -rf $(OMEGACONF23)
	$(BIN)/pip install -q --no-deps --target $(OMEGACONF23) \
		"hydra-core==1.3.*" "omegaconf==2.3.*" "antlr4-python3-runtime==4.9.*"
	touch $@

demo: $(VENV)/.installed-base
	$(BIN)/anemoi-profiler demo $(ARGS)

LINTED := src tests benchmarks examples
PYTEST := $(BIN)/python -m pytest
# Most tests wait on sleeps, child processes and servers: 4 workers overlap them on 2 cores. loadgroup keeps the
# tests that read one module-scoped fit on one worker (tests/conftest.py). `make test XDIST=` runs in one process.
XDIST ?= -n 4 --dist loadgroup
# pytest exits 5 when it selects no test: a tier left empty (its tests moved to another) says so and passes.
EMPTY_TIER_PASSES = status=$$?; [ $$status -eq 5 ] && echo "$@: no test selected" || exit $$status

# The loop after every edit: lint, import contracts and the unit tests (no mypy, no docs build).
check: $(VENV)/.installed-dev
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports
	$(PYTEST) tests/unit -q -n 2 $(PYTEST_ARGS); $(EMPTY_TIER_PASSES)

# Every distinct path once; the repetitions, long runs and fault suites (marked `soak`) are left to `make soak`.
test: $(VENV)/.installed-dev $(OMEGACONF23)/.installed
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site
	$(PYTEST) -m "not soak" $(XDIST) $(PYTEST_ARGS); $(EMPTY_TIER_PASSES)

# In one process: its fault suites wait on deadlines and one test brings its own busy loops (tests/README.md).
soak: $(VENV)/.installed-dev $(OMEGACONF23)/.installed
	$(PYTEST) -m soak $(PYTEST_ARGS); $(EMPTY_TIER_PASSES)

# The version matrix (docs/versions.md): the tests marked `stack` on the declared floor (Python 3.10, torch 2.4,
# Lightning 2.2, MLflow 2.16) and on anemoi-training's own install (torch 2.10). Cached environments, not .venv.
matrix:
	bash ci/matrix/run.sh

# A real `anemoi-training train` with the profiler, checked in anemoi's MLflow run (docs/anemoi.md). Its environment
# is built by ci/anemoi/setup.sh once, then cached under ~/.cache/anemoi-profiler; it does not use .venv.
anemoi-e2e:
	bash ci/anemoi/run.sh

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check $(LINTED) && $(BIN)/ruff format --check $(LINTED)

docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) profiler_runs .pytest_cache
