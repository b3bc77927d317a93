"""The `Services` container: the services of one runtime, by role.

Layer: base. A plain class whose every field is optional, given by keyword (not a dataclass: it is
defined at every start, docs/architecture.md#import-cost); code that needs a service reads it from
the container *at call time* and applies its own rule for absence (fail loud with a stable code, or
skip an optional accelerator). Field types are imported only for type checking, so this
module imports no layer at run time. Fields are added as their layers land.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsh.agent.approval import ApprovalBroker
    from dsh.agent.loop import Agent
    from dsh.agent.registry import AgentRegistry
    from dsh.persistence.base import SessionPersistence
    from dsh.projection.cache import ProjectionCache
    from dsh.projection.registry import ProjectionRegistry
    from dsh.query.service import SessionQuery
    from dsh.session.store import SessionStore
    from dsh.subagent.runtime import SubagentRuntime

__all__ = ["Services"]


class Services:
    """Services by role; a field is None when the service is not mounted (assign one to mount it)."""

    def __init__(
        self,
        *,
        sessions: SessionStore | None = None,
        persistence: SessionPersistence | None = None,
        projections: ProjectionRegistry | None = None,
        projection_cache: ProjectionCache | None = None,
        query: SessionQuery | None = None,
        agents: AgentRegistry[Agent] | None = None,
        subagents: SubagentRuntime | None = None,
        approvals: ApprovalBroker | None = None,
    ) -> None:
        self.sessions = sessions
        self.persistence = persistence
        self.projections = projections
        self.projection_cache = projection_cache
        self.query = query
        self.agents = agents
        self.subagents = subagents
        self.approvals = approvals

    def __repr__(self) -> str:
        mounted = ", ".join(f"{name}={type(value).__name__}" for name, value in vars(self).items() if value is not None)
        return f"Services({mounted})"


# Shown under the name users import (docs/architecture.md#public-names).
Services.__module__ = "dsh"
