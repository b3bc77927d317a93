"""`Runtime.tools`: the default tool set is built on first use, and a name clash is still refused at open."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dsh.agent.errors import ToolError
from dsh.config import Config
from dsh.runtime import Runtime
from tests.agent.helpers import EchoTool


class _ClashingTool(EchoTool):
    """An echo tool under the name of a default tool."""

    name = "agent"


def test_the_default_tools_are_built_once_on_first_use() -> None:
    """`rt.tools` holds the four default tools, and reading it again gives the same registry."""
    rt = Runtime.open(Config(database_url="memory:"))
    tools = rt.tools
    assert tools.names() == ("agent", "interrupt_agent", "list_agents", "send_message")
    assert rt.tools is tools


def test_a_tool_named_like_a_default_tool_is_refused_at_open() -> None:
    """An extra tool whose name a default tool already holds fails `Runtime.open` with `DUPLICATE_TOOL`."""
    with pytest.raises(ToolError) as caught:
        Runtime.open(Config(database_url="memory:"), tools=[_ClashingTool()])
    assert caught.value.code == "DUPLICATE_TOOL"


@pytest.mark.slow
def test_opening_a_runtime_without_agents_loads_no_tool_module() -> None:
    """A runtime that is only opened never imports the tools (their pydantic argument models)."""
    code = (
        "import sys\nfrom dsh import Config, Runtime\nRuntime.open(Config(database_url='memory:'))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('dsh.tools', 'dsh.agent.loop'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
