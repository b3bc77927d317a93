"""Fixtures of the interop suite: the TypeScript harness as one process per test session.

The first test that asks for `harness` installs the toolchain (once per cache, see
`tests/interop/toolchain.py`), copies the harness's pinned sources to a temporary folder with our
drivers, and starts the driver. Without Node 22 (no npm, no registry, another platform) or without
the pinned sources, every interop test is skipped with the reason; under CI (`CI` set to anything
but empty, `0`, `false` or `no`) it fails instead, because CI must run the suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.harness import HarnessProcess, upstream_sources
from tests.interop.toolchain import ToolchainUnavailable, ensure_toolchain


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def _unavailable(error: ToolchainUnavailable) -> None:
    if _on_ci():
        pytest.fail(f"the interop suite must run on CI, but: {error}", pytrace=False)
    pytest.skip(f"interop suite skipped: {error}")


@pytest.fixture(scope="session")
def upstream() -> Path:
    """The harness's pinned sources (`../shared/upstream-dsh` beside the repository)."""
    try:
        return upstream_sources()
    except ToolchainUnavailable as error:
        _unavailable(error)
        raise


@pytest.fixture(scope="session")
def harness(upstream: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessProcess]:
    """The TypeScript harness's own session code, answering the tests' requests."""
    try:
        toolchain = ensure_toolchain()
    except ToolchainUnavailable as error:
        _unavailable(error)
        raise
    process = HarnessProcess.start(toolchain, tmp_path_factory.mktemp("harness"))
    try:
        yield process
    finally:
        process.close()
