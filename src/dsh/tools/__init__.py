"""The model-facing tools every agent is offered: `agent`, `interrupt_agent`, `list_agents`, `send_message`.

Layer: tools (above `dsh.subagent`, below the composition root). The tools implement the `Tool`
protocol of `dsh.agent.tools`; `Runtime` registers `default_tools(config.subagent)` in its default
tool set, so every agent (subagents included) can delegate, list, message and interrupt. What the
model sees of them — parameters, descriptions, renders and error texts — is described in docs/tools.md.

* `delegate.py`: `AgentTool` (`agent`), the delegation tool.
* `subagent_control.py`: `ListAgentsTool`, `SendMessageTool`, `InterruptAgentTool`, and the row
  projection `list_agents` shows.
"""

from __future__ import annotations

from dsh.agent.tools import Tool
from dsh.config import SubagentConfig
from dsh.tools.delegate import DEFAULT_PROVIDER, AgentTool, SubagentStoppedError
from dsh.tools.subagent_control import InterruptAgentTool, ListAgentsTool, SendMessageTool

__all__ = [
    "AgentTool",
    "InterruptAgentTool",
    "ListAgentsTool",
    "SendMessageTool",
    "SubagentStoppedError",
    "default_tools",
]


def default_tools(config: SubagentConfig | None = None, *, provider: str = DEFAULT_PROVIDER) -> list[Tool]:
    """The default tool set, sorted by name: `agent`, `interrupt_agent`, `list_agents`, `send_message`.

    Args:
        config: Subagent settings; `max_depth` caps the depth of children `agent` starts (default 3).
        provider: The subagent provider `agent` starts children with (default `spawn`).
    """
    settings = config if config is not None else SubagentConfig()
    return [
        AgentTool(max_depth=settings.max_depth, provider=provider),
        InterruptAgentTool(),
        ListAgentsTool(),
        SendMessageTool(),
    ]
