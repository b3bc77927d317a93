"""`SubagentRuntime`: the subagent service (`Services.subagents`).

Layer: subagent. It owns the provider registry (`spawn` and `fork` are registered at construction),
one-shot runs (`start`), continuable children (`start_continuable`, `followup` with cold resume,
`interrupt`, settlement and the parent notice), the in-process lifecycle notifications
(`subagent/start`, `subagent/end`, `subagent/provider-added`, `subagent/provider-removed`), the drain
on close, and the child catalog (`list_children`, `list_descendants`; docs/catalog.md). Operations
are described in docs/subagents.md. Agents run on the `AgentHost` passed in (the composition root);
without one the runtime still lists children but runs none.

The runtime also owns the registrations of the `subagent` and `subagentTiming` projection units.
Units are registered when the runtime is built (if a registry is mounted) and again, idempotently,
at each listing in whichever registry `services.projections` holds then, so a registry mounted later
still serves the keys. The runtime releases its registrations in `release_units()`, which the
composition root calls after the projection cache has written (the cache closes first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsh.abort import AbortSignal
from dsh.errors import ConfigError
from dsh.json import NotJsonError, freeze
from dsh.subagent.depth import check_max_depth, child_depth
from dsh.subagent.errors import SubagentError
from dsh.subagent.host import AgentHost
from dsh.subagent.listing import ListingReport, list_children, list_descendants
from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry
from dsh.subagent.units import subagent_identity_unit, subagent_timing_unit

if TYPE_CHECKING:
    # The machinery that runs children (providers, continuations, the agent messages) loads when a
    # runtime first runs or drives one, so a runtime that only lists never imports it
    # (docs/architecture.md#import-cost).
    from dsh.agent.loop import Agent
    from dsh.agent.messages import Source
    from dsh.config import SubagentConfig
    from dsh.projection.registry import ProjectionRegistry
    from dsh.services import Services
    from dsh.subagent._continuation import ContinuationManager
    from dsh.subagent.activation import Activation
    from dsh.subagent.authority import AncestorAuthority, Authority, UserAuthority
    from dsh.subagent.providers import (
        ContinuablePreparation,
        ContinuableSpec,
        ContinuableStarted,
        ProviderCapabilities,
        SubagentProvider,
        SubagentRequest,
        SubagentResult,
        SubagentRun,
    )

__all__ = [
    "AgentHost",
    "AncestorAuthority",
    "ContinuablePreparation",
    "ContinuableSpec",
    "ContinuableStarted",
    "LifecycleListener",
    "ProviderCapabilities",
    "SubagentProvider",
    "SubagentRequest",
    "SubagentResult",
    "SubagentRun",
    "SubagentRuntime",
    "UserAuthority",
]

_log = logging.getLogger("dsh.subagent")

_PROVIDER_NAMES = frozenset(
    {
        "ContinuablePreparation",
        "ContinuableSpec",
        "ContinuableStarted",
        "ProviderCapabilities",
        "SubagentProvider",
        "SubagentRequest",
        "SubagentResult",
        "SubagentRun",
    }
)


def __getattr__(name: str) -> object:
    """The provider records and authorities re-exported here, loaded on first access."""
    if name in _PROVIDER_NAMES:
        from dsh.subagent import providers

        return getattr(providers, name)
    if name in ("AncestorAuthority", "UserAuthority"):
        from dsh.subagent import authority

        return getattr(authority, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LifecycleListener = Callable[[Mapping[str, Any]], None]
"""Called with each lifecycle notification (`{"type": "subagent/start", ...}` and the others)."""

# A one-shot request field, the capability it needs and how a refusal names it, in checking order.
_CAPABILITY_CHECKS = (
    ("output_schema", "output_schema", "an output schema"),
    ("max_depth", "depth_limit", "a depth limit"),
    ("tool_filter", "tool_filter", "a tool filter"),
    ("persona", "persona", "a persona"),
)


def _check_output_schema(schema: object) -> None:
    """Accept None or a JSON object-rooted schema (`{"type": "object", ...}`)."""
    if schema is None:
        return
    problem = 'subagent outputSchema must be a JSON Schema object whose type is "object"'
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError(problem)
    try:
        freeze(dict(schema))
    except NotJsonError as error:
        raise ValueError(f"{problem}: {error}") from error


class SubagentRuntime:
    """The subagent service: providers, runs, continuable children, notifications, drain and the catalog.

    Args:
        services: The container read at call time (a test may mount or unmount services between calls).
        config: Validated subagent settings (`cold_read_concurrency`, `max_depth`).
        host: Runs child agents (the `Runtime`); without one, operations that run agents fail with
            `CONTINUATION_UNAVAILABLE`.
    """

    def __init__(
        self, services: Services, *, config: SubagentConfig | None = None, host: AgentHost | None = None
    ) -> None:
        from dsh.config import SubagentConfig  # pydantic loads with the runtime, not with this module

        if config is not None and not isinstance(config, SubagentConfig):
            raise ConfigError("SubagentRuntime config must be a SubagentConfig")
        self.services = services
        self.config = config if config is not None else SubagentConfig()
        self._host = host
        self._registrations: list[tuple[ProjectionRegistry, list[Callable[[], None]]]] = []
        self._closed = False
        self._listeners: list[LifecycleListener] = []
        self._providers: dict[str, SubagentProvider] = {}
        self._runs: dict[SubagentRun, asyncio.Future[SubagentResult]] = {}
        # Built on first use (`_machinery`): the composer, the continuation manager and the built-in
        # `spawn` and `fork` providers, which stay first in registration order.
        self._manager: ContinuationManager | None = None
        self._drained_early = False
        if services.projections is not None:
            self._ensure_units(services.projections)

    def _machinery(self) -> ContinuationManager:
        """The continuation manager, with the composer and the built-in providers built on first use."""
        if self._manager is None:
            from dsh.subagent._compose import ChildComposer
            from dsh.subagent._continuation import ContinuationManager
            from dsh.subagent._inprocess import InProcessProvider

            composer = ChildComposer(self.services, self._host)
            self._manager = ContinuationManager(self.services, composer, provider_of=self.get_provider, emit=self._emit)
            built_in: dict[str, SubagentProvider] = {
                name: InProcessProvider(name, inherits_parent_context=inherits, composer=composer)
                for name, inherits in (("spawn", False), ("fork", True))
            }
            self._providers = built_in  # nothing registers before this: every provider path builds it first
        return self._manager

    async def _continuations(self) -> ContinuationManager:
        """The continuation manager; one built after an early drain is drained too (it admits nothing)."""
        manager = self._machinery()
        if self._drained_early and not manager.draining:
            await manager.drain()
        return manager

    @property
    def _draining(self) -> bool:
        return self._drained_early or (self._manager is not None and self._manager.draining)

    # ---------------------------------------------------------------- notifications

    def on_event(self, listener: LifecycleListener) -> Callable[[], None]:
        """Call `listener(event)` for every lifecycle notification; returns an idempotent unsubscribe.

        A raising listener is logged and never fails the operation that emitted the event (except
        `subagent/provider-added`, whose failure rolls the registration back).
        """
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _emit(self, event: dict[str, Any]) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                _log.exception("subagent lifecycle listener raised on %s", event.get("type"))

    # ---------------------------------------------------------------- providers

    def register_provider(self, provider: SubagentProvider) -> Callable[[], None]:
        """Add a provider; returns a disposer that removes it (runs already returned are not revoked).

        Raises:
            SubagentError: `DUPLICATE_PROVIDER` when the name is taken.
            Exception: What a `subagent/provider-added` listener raised (the registration is rolled back).
        """
        self._machinery()  # the built-in providers keep their names and come first
        name = provider.name
        if name in self._providers:
            raise SubagentError(f'subagent provider "{name}" is already registered', "DUPLICATE_PROVIDER")
        self._providers[name] = provider
        try:
            for listener in list(self._listeners):
                listener({"type": "subagent/provider-added", "provider": name})
        except BaseException:
            if self._providers.get(name) is provider:
                del self._providers[name]
            raise

        def dispose() -> None:
            if self._providers.get(name) is provider:
                del self._providers[name]
                self._emit({"type": "subagent/provider-removed", "provider": name})

        return dispose

    def get_provider(self, name: str) -> SubagentProvider | None:
        """The provider registered under `name`, or None."""
        self._machinery()
        return self._providers.get(name)

    def providers(self) -> tuple[str, ...]:
        """Registered provider names, in registration order."""
        self._machinery()
        return tuple(self._providers)

    # ---------------------------------------------------------------- one-shot runs

    async def start(self, provider: str, request: SubagentRequest) -> SubagentRun:
        """Start a one-shot child (docs/subagents.md#one-shot-runs).

        The provider receives a copy of `request` carrying the one-shot descriptor. `subagent/start`
        is emitted once the provider returned the run, `subagent/end` when its result settles.

        Raises:
            SubagentError: `NO_PROVIDER`, `UNSUPPORTED_CAPABILITY` (output schema, depth limit, tool
                filter, persona: the first missing one), `DRAINING`.
            ValueError: An invalid `max_depth` or `output_schema`.
            SubagentDepthError: The child would exceed `max_depth`.
            Exception: What the provider's `start` raised, unchanged.
        """
        found = self.get_provider(provider)
        if found is None:
            raise SubagentError(f'no subagent provider named "{provider}" is registered', "NO_PROVIDER")
        capabilities = found.capabilities
        for field, capability, named in _CAPABILITY_CHECKS:
            if getattr(request, field) is not None and not getattr(capabilities, capability):
                raise SubagentError(
                    f'subagent provider "{provider}" does not support {named}', "UNSUPPORTED_CAPABILITY"
                )
        check_max_depth(request.max_depth)
        _check_output_schema(request.output_schema)
        if self._draining:
            raise SubagentError("the subagent runtime is draining and admits no new subagent work", "DRAINING")
        if request.max_depth is not None:
            child_depth(request.parent, request.max_depth)
        from dsh.subagent.descriptor import snapshot_descriptor

        descriptor = snapshot_descriptor("one-shot", provider=provider, label=request.label)
        run = await found.start(dataclasses.replace(request, descriptor=descriptor))
        identity = {
            "runId": self._host.ids.run() if self._host is not None else str(uuid.uuid4()),
            "provider": provider,
            "parentSessionId": request.parent.id,
            "childSessionId": run.id,
            "local": run.local_agent is not None,
        }
        # Kept until it settles: a provider may hand back any awaitable, and a task nobody holds may vanish.
        result = self._runs[run] = asyncio.ensure_future(run.result)
        self._emit({"type": "subagent/start", **identity})
        result.add_done_callback(lambda done: self._run_ended(run, identity, done))
        return run

    def _run_ended(self, run: SubagentRun, identity: Mapping[str, Any], done: asyncio.Future[SubagentResult]) -> None:
        from dsh.agent.messages import text_of_blocks

        self._runs.pop(run, None)
        output: Sequence[Mapping[str, Any]] = ()
        if done.cancelled():
            stop_reason = "aborted"
        elif done.exception() is not None:
            stop_reason = "error"
        else:
            result = done.result()
            stop_reason, output = result.stop_reason, result.output
        end: dict[str, Any] = {"type": "subagent/end", **identity, "stopReason": stop_reason, "hasOutput": bool(output)}
        closing = text_of_blocks(output)
        if closing:
            end["lastAssistantMessage"] = closing
        self._emit(end)

    # ---------------------------------------------------------------- continuable children

    async def start_continuable(self, spec: ContinuableSpec) -> ContinuableStarted:
        """Create a continuable child and queue its prompt; returns at inbox acceptance.

        Raises:
            SubagentError: `CONTINUATION_UNAVAILABLE`, `DRAINING`, `ACTIVATION_CLOSING`,
                `PERSISTENCE_UNAVAILABLE`, `DUPLICATE_CHILD`, `NO_PROVIDER`, `UNSUPPORTED_CAPABILITY`.
            ValueError, SubagentDepthError: An invalid `max_depth`, or a child past it.
            BaseException: The signal's own reason when the caller aborted before acceptance.
        """
        return await (await self._continuations()).start(spec)

    async def followup(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[Mapping[str, Any]] | str,
        *,
        source: Source,
        signal: AbortSignal | None = None,
    ) -> str:
        """Queue `content` as the child's next turn (resuming it cold when needed); returns the message id.

        Raises:
            SubagentError: `CONTINUATION_UNAVAILABLE`, `DRAINING`, `ACTIVATION_CLOSING`,
                `UNAUTHORIZED`, `PERSISTENCE_UNAVAILABLE`, `NOT_RESUMABLE`.
            BaseException: The signal's own reason when the caller aborted.
        """
        manager = await self._continuations()
        return await manager.followup(parent, child_id, content, source=source, signal=signal)

    async def interrupt(self, target_id: str, authority: Authority) -> None:
        """Cancel the target's current turn (its inbox is kept); returns once accepted.

        Raises:
            SubagentError: `UNAUTHORIZED` (not the exact live caller, itself, not a live descendant,
                another parent session).
        """
        await (await self._continuations()).interrupt(target_id, authority)

    def activation(self, child_id: str) -> Activation | None:
        """The resident Activation of a continuable child, or None."""
        return self._manager.activation(child_id) if self._manager is not None else None

    async def settled(self) -> None:
        """Wait until no Activation is settling or being disposed (their parents' notices are queued)."""
        if self._manager is not None:
            await self._manager.settled()

    # ---------------------------------------------------------------- the catalog

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

    # ---------------------------------------------------------------- close

    async def drain(self) -> None:
        """Close admission (`DRAINING` from now on) and dispose every Activation child-first, then every run.

        Raises:
            SubagentError: `ACTIVATION_TEARDOWN_FAILED` when releasing an Activation failed.
        """
        failure: SubagentError | None = None
        try:
            if self._manager is not None:
                await self._manager.drain()
            else:
                self._drained_early = True  # nothing ran: no Activation to dispose, admission closes all the same
        except SubagentError as error:
            failure = error
        for run in list(self._runs):
            try:
                await run.dispose()
            except Exception:
                _log.exception('subagent run "%s": disposal failed', run.id)
        if failure is not None:
            raise failure

    async def aclose(self) -> None:
        """Drain (idempotent). Unit registrations stay until `release_units()`, which the composition
        root calls after the projection cache has written its final checkpoints (those need the units)."""
        if self._closed:
            return
        self._closed = True
        await self.drain()

    async def __aenter__(self) -> SubagentRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# Shown under the name users import (docs/architecture.md#public-names).
SubagentRuntime.__module__ = "dsh"
