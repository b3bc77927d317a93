"""Fixtures of the model-facing tool tests (helpers live in `tests.tools.helpers`)."""

from __future__ import annotations

import pytest

from dsh.agent.tools import Tool
from dsh.tools import default_tools


@pytest.fixture
def tools() -> dict[str, Tool]:
    """The default tool set, by name, built from the default subagent settings."""
    return {tool.name: tool for tool in default_tools()}
