# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# CPU machines get the local CPU wheel of torch through constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MLFLOW_DISABLE_TELEMETRY := true
export NO_MKDOCS_2_WARNING := 1

.PHONY: demo test lint docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-base: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-base
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,hta]"
	touch $@

demo: $(VENV)/.installed-base
	$(BIN)/anemoi-profiler demo $(ARGS)

test: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests && $(BIN)/ruff format --check src tests

docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) profiler_runs .pytest_cache
