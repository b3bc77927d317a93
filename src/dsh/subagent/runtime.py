"""`SubagentRuntime`: the subagent service (`Services.subagents`).

Layer: subagent. It owns the registrations of the `subagent` and `subagentTiming` projection units
and serves the child catalog (`list_children`, `list_descendants`). Units are registered when the
runtime is built (if a registry is mounted) and again, idempotently, at each call in whichever
registry `services.projections` holds then, so a registry mounted later still serves the keys. The
runtime releases its registrations when it closes — after the projection cache has written (the
composition root closes the cache first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dsh.abort import AbortSignal
from dsh.config import SubagentConfig
from dsh.errors import ConfigError
from dsh.subagent.listing import ListingReport, list_children, list_descendants
from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry
from dsh.subagent.units import subagent_identity_unit, subagent_timing_unit

if TYPE_CHECKING:
    from dsh.projection.registry import ProjectionRegistry
    from dsh.services import Services

__all__ = ["SubagentRuntime"]


class SubagentRuntime:
    """The subagent service: unit registrations and the catalog.

    Args:
        services: The container read at call time (a test may mount or unmount services between calls).
        config: Validated subagent settings (`cold_read_concurrency`, `max_depth`).
    """

    def __init__(self, services: Services, *, config: SubagentConfig | None = None) -> None:
        if config is not None and not isinstance(config, SubagentConfig):
            raise ConfigError("SubagentRuntime config must be a SubagentConfig")
        self.services = services
        self.config = config if config is not None else SubagentConfig()
        self._registrations: list[tuple[ProjectionRegistry, list[Callable[[], None]]]] = []
        self._closed = False
        if services.projections is not None:
            self._ensure_units(services.projections)

    def _ensure_units(self, registry: ProjectionRegistry) -> None:
        # Also after close: a listing must never run without the unit it reads (that would turn every
        # cold child into a false `corrupt` row); a later `release_units()` drops it again.
        if any(known is registry for known, _ in self._registrations):
            return
        disposers: list[Callable[[], None]] = []
        try:
            for unit in (subagent_identity_unit(), subagent_timing_unit()):
                disposers.append(registry.register(unit))  # noqa: PERF401 - keeps partial progress for the rollback
        except BaseException:
            # All or nothing: a refused second unit must not leave the first one registered here.
            for dispose in disposers:
                dispose()
            raise
        self._registrations.append((registry, disposers))

    async def list_children(
        self,
        parent_session_id: str,
        *,
        signal: AbortSignal | None = None,
        report: Callable[[ListingReport], None] | None = None,
    ) -> list[SubagentListEntry]:
        """The direct subagent children of a parent (docs/catalog.md#enumeration); read-only, keeps no state."""
        return await list_children(
            self.services,
            parent_session_id,
            signal=signal,
            cold_read_concurrency=self.config.cold_read_concurrency,
            ensure_units=self._ensure_units,
            report=report,
        )

    async def list_descendants(
        self,
        root_session_id: str,
        *,
        signal: AbortSignal | None = None,
        report: Callable[[ListingReport], None] | None = None,
    ) -> list[SubagentDescendantEntry]:
        """Every subagent below a root, in pre-order with parent id and depth (docs/catalog.md#descendants)."""
        return await list_descendants(
            self.services,
            root_session_id,
            signal=signal,
            cold_read_concurrency=self.config.cold_read_concurrency,
            ensure_units=self._ensure_units,
            report=report,
        )

    def release_units(self) -> None:
        """Drop every unit registration this runtime made (idempotent)."""
        registrations, self._registrations = self._registrations, []
        for _, disposers in registrations:
            for dispose in disposers:
                dispose()

    async def aclose(self) -> None:
        """Close the runtime. Unit registrations stay until `release_units()`, which the composition
        root calls after the projection cache has written its final checkpoints (those need the units)."""
        self._closed = True

    async def __aenter__(self) -> SubagentRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
