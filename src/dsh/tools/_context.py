"""What every model-facing tool reads from its `ToolContext`: the calling agent and the subagent service.

Layer: tools (private helper of the package). A tool body looks both up at call time, so a tool
built once serves every agent of a runtime, and a test can mount or unmount services between calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh.agent.tools import CallingAgent, ToolContext
from dsh.subagent.errors import SubagentError

if TYPE_CHECKING:
    from dsh.subagent.runtime import SubagentRuntime

__all__ = ["calling_agent", "subagent_service"]


def calling_agent(ctx: ToolContext, tool: str) -> CallingAgent:
    """The agent that made the call.

    Raises:
        RuntimeError: `<tool> requires a calling agent (exec.agent was undefined)` when the tool
            runs outside an agent; every subagent tool acts on behalf of its caller, so it has no
            meaning without one.
    """
    agent = ctx.agent
    if agent is None:
        raise RuntimeError(f"{tool} requires a calling agent (exec.agent was undefined)")
    return agent


def subagent_service(ctx: ToolContext, tool: str) -> SubagentRuntime:
    """`ctx.services.subagents`, for the tools that start or reach a subagent.

    Raises:
        SubagentError: `CONTINUATION_UNAVAILABLE` when the runtime mounts no subagent service.
    """
    subagents = ctx.services.subagents
    if subagents is None:
        raise SubagentError(
            f"{tool} requires the subagent service (services.subagents is not mounted)", "CONTINUATION_UNAVAILABLE"
        )
    return subagents
