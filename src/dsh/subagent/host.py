"""`AgentHost`: what the subagent runtime needs from the composition root to run child agents.

Layer: subagent. The subagent layer never imports `dsh.runtime`; `Runtime` satisfies this protocol
and passes itself as `SubagentRuntime(services, host=runtime)`. A runtime built without a host can
still list children, but it cannot run any (docs/subagents.md#providers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dsh.agent.ids import IdFactory
    from dsh.agent.loop import Agent, AgentOptions
    from dsh.agent.model import ModelClient
    from dsh.agent.tools import ToolRegistry
    from dsh.session.session import Session

__all__ = ["AgentHost"]


class AgentHost(Protocol):
    """Runs agents: ids, the default tools, the model client and options, and agent start-up."""

    @property
    def ids(self) -> IdFactory:
        """Mints child session ids and run ids."""

    @property
    def tools(self) -> ToolRegistry:
        """The default tool set; a child gets it, narrowed by its tool filter."""

    def model_client(self) -> ModelClient:
        """The model client every agent of the host streams from."""

    def agent_options(self, **overrides: object) -> AgentOptions:
        """The options of a new agent (the host's defaults, then `overrides`)."""

    def start_agent(
        self, session: Session, *, options: AgentOptions | None = None, tools: ToolRegistry | None = None
    ) -> Agent:
        """Wrap a live session in an agent, register it in `services.agents` and start its worker."""
