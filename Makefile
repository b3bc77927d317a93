# Two commands matter: `make demo` and `make test`. Both work on a fresh clone with only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test check format lint typecheck pytest pytest-fast bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	rm -f $(VENV)/.installed-* $(VENV)/.bench-*
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

demo: $(STAMP)
	$(BIN)/dsh demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

pytest-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# The inner loop: lint, types and the fast tests with small hypothesis example counts (under a minute).
check: lint typecheck pytest-fast

# The full gate, what CI runs: every test, full example counts when CI is set.
test: lint typecheck pytest

format: $(STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

# Every benchmark (or `make bench BENCH="p7_listing p5_cold_read"`), then bench/results/summary.md;
# DSH_BENCH_QUICK=1 for a short smoke run.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
