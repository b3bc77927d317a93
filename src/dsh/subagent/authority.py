"""Who may interrupt a subagent: a person acting for a parent session, or a live ancestor agent.

Layer: subagent. `SubagentRuntime.interrupt(target, authority)` takes one of these
(docs/subagents.md#interrupt-and-authority).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsh.agent.loop import Agent

__all__ = ["AncestorAuthority", "Authority", "UserAuthority"]


@dataclass(frozen=True, slots=True)
class UserAuthority:
    """A person (the host UI) acting for the child's durable parent session."""

    parent_session_id: str


@dataclass(frozen=True, slots=True)
class AncestorAuthority:
    """A live agent (through a tool) acting on a child or deeper descendant it started."""

    agent: Agent


Authority = UserAuthority | AncestorAuthority
