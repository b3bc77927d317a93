"""Every subagent tool acts for the agent that called it: without one it fails before touching a service."""

from __future__ import annotations

from typing import Any

import pytest

from dsh.agent.tools import Tool
from dsh.services import Services
from tests.tools.helpers import StubSubagents, call_tool

_ARGUMENTS: dict[str, dict[str, Any]] = {
    "agent": {"description": "Draft outline", "prompt": "Outline the essay.", "run_in_background": True},
    "interrupt_agent": {"agent_id": "child"},
    "list_agents": {},
    "send_message": {"subagent_id": "child", "message": "more"},
}


@pytest.mark.parametrize("name", sorted(_ARGUMENTS))
async def test_a_tool_without_a_calling_agent_is_an_errored_result(tools: dict[str, Tool], name: str) -> None:
    """Without a calling agent each tool returns `Error: <name> requires a calling agent (...)` and asks no service."""
    stub = StubSubagents()
    outcome = await call_tool(tools[name], _ARGUMENTS[name], agent=None, services=Services(subagents=stub))  # type: ignore[arg-type]
    assert outcome.is_error
    assert outcome.text == f"Error: {name} requires a calling agent (exec.agent was undefined)"
    assert "requires a calling agent" in outcome.text
    assert stub.calls == []
