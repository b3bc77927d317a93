"""Fixtures of the browser tests (helpers live in `tests.ui.helpers`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.server.helpers import Api, api
from tests.ui.helpers import DemoHome, chromium_executable, fill_demo_home


@pytest.fixture
def chromium() -> str:
    """The chromium binary (the test is skipped outside CI, and fails on CI, when there is none)."""
    return chromium_executable()


@pytest.fixture(scope="session")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> DemoHome:
    """A home the demo scenario filled once per run; tests copy it."""
    return fill_demo_home(tmp_path_factory.mktemp("demo") / "home")


@pytest.fixture
def demo_home(demo_template: DemoHome, tmp_path: Path) -> DemoHome:
    """This test's own copy of the demo home."""
    return demo_template.copy(tmp_path / "home")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Api]:
    """A scripted runtime on an empty JSONL home, served on 127.0.0.1:0 (for the routes, no browser)."""
    async with api(tmp_path / "home") as ready:
        yield ready
