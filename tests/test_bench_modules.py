"""Every benchmark module imports cleanly and exposes `main` (they run under `make bench`, not here)."""

from __future__ import annotations

import importlib

import pytest

from bench.__main__ import BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_module_imports(name: str) -> None:
    """`bench.<name>` imports without the optional peers installed and has a callable `main`."""
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.main)
    assert module.__doc__
