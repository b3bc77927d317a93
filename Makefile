# Two commands matter: `make demo` and `make test`. Both work on a fresh clone with only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The install is redone when what it builds from changes: the project file.
BUILD_INPUTS := pyproject.toml
INPUTS_SUM := $(shell cat $(BUILD_INPUTS) | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(INPUTS_SUM)
BENCH_STAMP := $(VENV)/.bench-$(INPUTS_SUM)

.PHONY: demo test check format lint typecheck pytest pytest-fast test-other-pythons bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	rm -f $(VENV)/.installed-* $(VENV)/.bench-*
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# `make demo DEMO_ARGS=--keep` keeps the demo's temporary home to look around in afterwards.
DEMO_ARGS ?=
demo: $(STAMP)
	$(BIN)/dsh demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# Bytecode is cached even where the shell says not to: with PYTHONDONTWRITEBYTECODE set, every run compiles
# every module again (and pytest rewrites every test module), which multiplies the suite's start-up and
# slows each test that starts a Python process. The caches live in one folder inside .venv (an absolute
# path, so a process started in a test's temporary folder writes nothing there), never beside the sources.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache

# Every test, in one process: what CI runs.
pytest: $(STAMP)
	$(BIN)/python -m pytest -q

# The tests not marked `slow`, spread over the cores by pytest-xdist (`make check CHECK_WORKERS=0` runs
# them in one process).
CHECK_WORKERS ?= auto
pytest-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(CHECK_WORKERS) --dist worksteal

# The inner loop: lint, types and the fast tests with small hypothesis example counts (under a minute);
# CONTRIBUTING.md says what it leaves out.
check: lint typecheck pytest-fast

# The full gate, what CI runs: every test, full example counts when CI is set.
test: lint typecheck pytest

# The fast tests once more on each newer CPython the machine has (.ci/other-pythons says how they are
# found; a missing one is skipped with a note). CI runs this after `make test`.
test-other-pythons:
	.ci/other-pythons

format: $(STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

# Every benchmark (or `make bench BENCH="p7_listing p5_cold_read"`), then bench/results/summary.md;
# DSH_BENCH_QUICK=1 for a short smoke run.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) .venv-* .mypy_cache .pytest_cache .ruff_cache
