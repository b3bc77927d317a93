"""Fixtures of the HTTP API tests (helpers live in `tests.server.helpers`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.server.helpers import Api, api


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Api]:
    """A scripted runtime on a JSONL home in `tmp_path`, served on 127.0.0.1:0, with a token-carrying client."""
    async with api(tmp_path / "home") as ready:
        yield ready
