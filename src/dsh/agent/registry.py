"""`AgentRegistry`: the live agents of one runtime, by id (`services.agents`).

Layer: agent. Only the registry answers "is this the exact live agent for that id?"
(`registry.get(agent_id) is agent`), which is what subagent delivery and interrupts authorise
against. Status (`running` from the claim of an inbox item to the flush after `turn/end`, `idle`
otherwise, `closed` once the agent left) feeds `list_agents`, the HTTP catalog's activity and the
push stream (docs/agent.md#agent-registry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, Literal, Protocol, TypeVar

from dsh.agent.errors import AgentError

__all__ = ["AgentRegistry", "AgentStatus", "LiveAgent", "StatusListener"]

_log = logging.getLogger("dsh.agent")

AgentStatus = Literal["running", "idle", "closed"]
StatusListener = Callable[[Any, AgentStatus], None]
"""Called with `(agent, status)`; the agent is the `dsh.agent.loop.Agent` whose status changed."""


class LiveAgent(Protocol):
    """What the registry needs of an agent (`dsh.agent.loop.Agent` satisfies it)."""

    @property
    def id(self) -> str:
        """The agent id."""

    @property
    def status(self) -> AgentStatus:
        """`running` or `idle`."""

    def on_status(self, listener: StatusListener) -> Callable[[], None]:
        """Subscribe to status changes."""


A = TypeVar("A", bound=LiveAgent)


class AgentRegistry(Generic[A]):
    """Live agents by id, with status notifications."""

    def __init__(self) -> None:
        self._agents: dict[str, A] = {}
        self._listeners: list[StatusListener] = []
        self._unsubscribe: dict[str, Callable[[], None]] = {}

    def register(self, agent: A) -> None:
        """Add `agent`.

        Raises:
            AgentError: `DUPLICATE_AGENT` when another agent holds the id.
        """
        if agent.id in self._agents:
            raise AgentError(f'agent "{agent.id}" is already registered', code="DUPLICATE_AGENT", session_id=agent.id)
        self._agents[agent.id] = agent
        self._unsubscribe[agent.id] = agent.on_status(self._relay)

    def unregister(self, agent: A) -> bool:
        """Remove `agent` if it is the registered object for its id; False otherwise."""
        if self._agents.get(agent.id) is not agent:
            return False
        del self._agents[agent.id]
        self._unsubscribe.pop(agent.id)()
        self._emit(agent, "closed")
        return True

    def get(self, agent_id: str) -> A | None:
        """The live agent with that id, or None."""
        return self._agents.get(agent_id)

    def list(self) -> tuple[A, ...]:
        """Live agents in registration order."""
        return tuple(self._agents.values())

    def status(self, agent_id: str) -> AgentStatus | None:
        """`running` or `idle` for a registered agent, None when absent."""
        agent = self._agents.get(agent_id)
        return None if agent is None else agent.status

    def subscribe(self, listener: StatusListener) -> Callable[[], None]:
        """Call `listener(agent, status)` on every status change; returns an idempotent unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _relay(self, agent: A, status: AgentStatus) -> None:
        if self._agents.get(agent.id) is agent:
            self._emit(agent, status)

    def _emit(self, agent: A, status: AgentStatus) -> None:
        for listener in list(self._listeners):
            try:
                listener(agent, status)
            except Exception:
                # A listener is an observer: its failure never changes an agent's state.
                _log.exception('agent "%s": status listener raised', agent.id)
