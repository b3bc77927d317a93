"""The `Services` container: the services of one runtime, by role.

Layer: base. A plain dataclass whose every field is optional; code that needs a service reads it
from the container *at call time* and applies its own rule for absence (fail loud with a stable
code, or skip an optional accelerator). Field types are imported only for type checking, so this
module imports no layer at run time. Fields are added as their layers land.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.agent.registry import AgentRegistry
    from dsh.persistence.base import SessionPersistence
    from dsh.projection.cache import ProjectionCache
    from dsh.projection.registry import ProjectionRegistry
    from dsh.query.service import SessionQuery
    from dsh.session.store import SessionStore
    from dsh.subagent.runtime import SubagentRuntime

__all__ = ["Services"]


@dataclass
class Services:
    """Services by role; a field is None when the service is not mounted."""

    sessions: SessionStore | None = None
    persistence: SessionPersistence | None = None
    projections: ProjectionRegistry | None = None
    projection_cache: ProjectionCache | None = None
    query: SessionQuery | None = None
    agents: AgentRegistry[Agent] | None = None
    subagents: SubagentRuntime | None = None
