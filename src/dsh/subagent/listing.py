"""The child catalog: `list_children` and `list_descendants`.

Layer: subagent (listing part; it needs nothing from `dsh.agent`). Enumeration reads the shared,
live-preferred query corpus filtered by parent (`query.filter_sessions`), so it costs the family,
not the whole store (docs/catalog.md#enumeration); each listed id is paired with the live store.
Mode and label come only from the registered `subagent` projection unit, read by a three-rung
"compute, then stop" ladder (docs/catalog.md#identity-rungs), cheapest first:

1. live identity: `projections.snapshot(session, ("subagent",))` + `is_own_seq` — zero log reads;
2. cached identity (unseeded cold child, cache mounted): `cached_snapshot(header, 0, ("subagent",))`
   — zero log reads;
3. observed identity (everything else): one body-carrying `query.observe_session` + the unit's fold
   + the own-suffix check.

Outcomes become rows through one table (`_ROW_WITHOUT_IDENTITY`, docs/catalog.md#row-states). Each
child is isolated: its failure becomes its own diagnostic row. Cold candidates go through a FIFO queue
consumed by at most `cold_read_concurrency` workers in one `asyncio.TaskGroup`; workers record every
outcome in their candidate's slot and never raise, so cancellation is cooperative: the caller's
`AbortSignal` is looked at before and after every corpus read, before and after each observation,
and once after all cold work (docs/catalog.md#cancellation-checkpoints); in-flight reads settle, and
only the caller's own task cancellation cancels tasks. The listing is read-only and keeps no state:
no cache writes, no memo, no descriptor parsing (this module imports no descriptor parser).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from dsh.abort import AbortSignal
from dsh.errors import ConfigError
from dsh.query.records import SessionFilter
from dsh.session.header import SessionHeader, SessionId, SessionLogOffset, SessionSeq
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import (
    DiagnosticReason,
    SubagentChildRow,
    SubagentDescendantEntry,
    SubagentDiagnosticRow,
    SubagentListEntry,
)

if TYPE_CHECKING:
    from dsh.projection.cache import ProjectionCache
    from dsh.projection.registry import ProjectionRegistry
    from dsh.query.service import SessionQuery
    from dsh.services import Services
    from dsh.session.events import SessionEvent
    from dsh.session.session import Session
    from dsh.session.store import SessionStore

__all__ = [
    "SUBAGENT_KEY",
    "ListingReport",
    "SubagentIdentity",
    "folded_identity",
    "list_children",
    "list_descendants",
]

SUBAGENT_KEY: Final = "subagent"
_KEYS: Final = (SUBAGENT_KEY,)


@dataclass(frozen=True, slots=True)
class SubagentIdentity:
    """The value the `subagent` unit folds: mode, label and the seq of the descriptor behind it.

    Raises:
        ValueError: On construction, for a continuable identity without a label.
    """

    mode: Literal["one-shot", "continuable"]
    seq: SessionSeq
    label: str | None = None

    def __post_init__(self) -> None:
        if self.mode == "continuable" and self.label is None:
            raise ValueError("a continuable identity requires a label")

    @classmethod
    def from_view(cls, value: object) -> SubagentIdentity:
        """Read the unit's client view; raises `ValueError` when it is not an identity."""
        if not isinstance(value, Mapping):
            raise ValueError("subagent view is not an object")
        mode, seq, label = value.get("mode"), value.get("seq"), value.get("label")
        if mode not in ("one-shot", "continuable"):
            raise ValueError("subagent view has no valid mode")
        if type(seq) is not int or seq < 0:
            raise ValueError("subagent view has no valid seq")
        if label is not None and type(label) is not str:
            raise ValueError("subagent view label is not a string")
        return cls(mode, SessionSeq(seq), label)


class _Outcome(Enum):
    """Why a rung ladder ended without an identity."""

    NO_VALUE = "no-value"
    """No identity, or only one replayed from the fork seed (it fails the own-suffix check)."""
    READ_FAILED = "read-failed"
    """The observation of a cold child raised while the signal was not aborted."""
    LIFECYCLE_CHANGED = "lifecycle-changed"
    """The observed header differs from the enumerated one: the id was deleted and republished."""
    UNIT_RAISED = "unit-raised"
    """The `subagent` unit's snapshot or fold raised (defensive: a unit has no failure channel)."""
    CANCELLED = "cancelled"
    """The caller's signal was seen aborted around an observation; the listing raises instead."""


# How a ladder outcome without an identity becomes a row. (An identity always becomes a child row,
# `running` for a live child and `inactive` for a cold one.) `None` omits the child.
#
#   outcome             live child   cold child    why
#   NO_VALUE            omitted      corrupt       live: the creation window, before the descriptor is
#                                                  appended; cold: a settled wreck (no descriptor, a bad
#                                                  one or an ancestor's only — they all look the same)
#   READ_FAILED         unavailable  unavailable   only cold children are read; the next call retries
#   LIFECYCLE_CHANGED   corrupt      corrupt       only cold children are read; never leak the new owner
#   UNIT_RAISED         corrupt      corrupt       a raising unit is never hidden by omission
#
# CANCELLED has no row: any abort makes the whole listing raise.
_ROW_WITHOUT_IDENTITY: Final[Mapping[_Outcome, tuple[DiagnosticReason | None, DiagnosticReason | None]]] = {
    # outcome: (reason for a live child, reason for a cold child)
    _Outcome.NO_VALUE: (None, "corrupt"),
    _Outcome.READ_FAILED: ("unavailable", "unavailable"),
    _Outcome.LIFECYCLE_CHANGED: ("corrupt", "corrupt"),
    _Outcome.UNIT_RAISED: ("corrupt", "corrupt"),
}


Rung = Literal[1, 2, 3]


class _Found(NamedTuple):
    identity: SubagentIdentity
    rung: Rung


_Result = _Found | _Outcome


class _Candidate:
    __slots__ = ("depth", "header", "live", "parent_id", "result")

    def __init__(self, header: SessionHeader, live: Session | None, parent_id: SessionId, depth: int) -> None:
        self.header = header
        self.live = live
        self.parent_id = parent_id
        self.depth = depth
        self.result: _Result | None = None


@dataclass(frozen=True, slots=True)
class ListingReport:
    """Per-row provenance of one listing call, for demos and diagnostics.

    Attributes:
        rungs: The rung (1 live, 2 cache, 3 log) that served each child row.
        observations: How many cold observations (log reads) the call made.
        unlisted: Stored entries the corpus could not list at all (an unreadable or invalid header,
            a log that is not a regular file, an unreadable folder ...). Their parent is unknown, so
            they are counted for the whole store, never shown as rows
            (docs/catalog.md#enumeration); `dsh agents` prints the count on stderr.
    """

    rungs: Mapping[SessionId, int]
    observations: int
    unlisted: int = 0


def _cancelled() -> SubagentError:
    return SubagentError("subagent listing was cancelled", "CANCELLED")


def _stray() -> bool:
    """True when a `CancelledError` reached a worker although nobody asked its task to cancel.

    A backend or cache may let a `CancelledError` of an inner future escape. That is a fault of one
    child's read, not a cancellation of the listing: treating it as task cancellation would end the
    worker silently and leave the rest of its queue unresolved. Real cancellation of the caller's
    task shows as `cancelling() > 0` on the worker (the TaskGroup forwards it) and is re-raised.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


_MAX_CONCURRENCY: Final = 64


def _check_concurrency(value: object) -> int:
    """`cold_read_concurrency` validated like the config field (an int in 1..64, never a bool)."""
    if type(value) is not int or not 1 <= value <= _MAX_CONCURRENCY:
        raise ConfigError(f"cold_read_concurrency must be an integer between 1 and {_MAX_CONCURRENCY}, got {value!r}")
    return value


def _require_unit(projections: ProjectionRegistry) -> None:
    """Mode and label come only from the `subagent` unit: without it every live child would be
    omitted and every cold one marked `corrupt`, so the listing refuses instead."""
    if SUBAGENT_KEY not in projections.keys():  # noqa: SIM118 - a registry method, not a dict
        raise SubagentError(
            f'listing subagents requires the "{SUBAGENT_KEY}" projection unit registered in services.projections',
            "SUBAGENT_CONTROL_UNITS_UNAVAILABLE",
        )


def _require(services: Services) -> tuple[ProjectionRegistry, SessionStore, SessionQuery]:
    """The required services, checked in a fixed order before any read.

    The checks run even for a parent with no children and even when the signal is already aborted:
    a configuration error is reported before cancellation, and never hidden as an empty list.
    """
    projections = services.projections
    if projections is None:
        raise SubagentError(
            "listing subagents requires the projection registry (services.projections)",
            "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE",
        )
    sessions = services.sessions
    if sessions is None:
        raise SubagentError(
            "listing subagents requires the session store (services.sessions)",
            "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE",
        )
    query = services.query
    if query is None:
        raise SubagentError(
            "listing subagents requires the session query service (services.query)",
            "SUBAGENT_CONTROL_QUERY_UNAVAILABLE",
        )
    return projections, sessions, query


class _Listing:
    """One listing call: enumeration, pairing, the ladder and the row mapping."""

    def __init__(
        self,
        services: Services,
        signal: AbortSignal,
        concurrency: int,
        ensure_units: Callable[[ProjectionRegistry], None] | None,
    ) -> None:
        self.concurrency = _check_concurrency(concurrency)
        self.projections, self.sessions, self.query = _require(services)
        self.cache: ProjectionCache | None = services.projection_cache
        self.signal = signal
        if ensure_units is not None:
            ensure_units(self.projections)
        _require_unit(self.projections)
        self.rungs: dict[SessionId, int] = {}
        self.observations = 0
        self.unlisted = 0
        self.reads = 0

    def aborted(self) -> bool:
        # A method, not a property read: the signal can flip across any await.
        return self.signal.aborted

    def raise_if_aborted(self) -> None:
        if self.aborted():
            raise _cancelled()

    async def enumerate(self, parents: Collection[str]) -> list[tuple[SessionHeader, Session | None]]:
        """The corpus under `parents` read between two abort checks, then paired with the live store.

        Pairing is one synchronous pass: a published session's header is the effective header,
        and only effective headers naming one of `parents` are kept, in `(createdAt, id)` order.
        The first read of a call also takes the count of stored entries nobody could list.
        """
        # Cancellation checkpoint: an abort seen before this read.
        self.raise_if_aborted()
        try:
            records = await self.query.filter_sessions(SessionFilter(parents=parents), signal=self.signal)
        except Exception:
            # A corpus failure after an abort is the abort; otherwise it propagates unchanged.
            if self.aborted():
                raise _cancelled() from None
            raise
        # Cancellation checkpoint: an abort seen while this read was in flight.
        self.raise_if_aborted()
        if self.reads == 0:
            # The stored entries the corpus could not list travel beside it (a plain list has none).
            self.unlisted = len(getattr(records, "unreadable", ()))
        self.reads += 1
        wanted = set(parents)
        paired: list[tuple[SessionHeader, Session | None]] = []
        for record in records:
            live = self.sessions.get(record.header.id)
            header = live.header if live is not None else record.header
            if header.parent_session in wanted:
                paired.append((header, live))
        paired.sort(key=lambda pair: _order(pair[0]))
        return paired

    async def subagent_parents(self, candidates: Sequence[_Candidate]) -> set[str]:
        """Which candidates have a subagent child: one more filtered read, for the listed ids only.

        The only window this adds to the first read: a grandchild published between the two reads
        counts (docs/catalog.md#enumeration).
        """
        ids = {candidate.header.id for candidate in candidates}
        if not ids:
            return set()
        return _with_subagent_children(await self.enumerate(ids))

    async def resolve(self, candidates: list[_Candidate]) -> None:
        """Fill every candidate's result: live ones synchronously, cold ones in a bounded pool."""
        cold: deque[_Candidate] = deque()
        for candidate in candidates:
            if candidate.live is not None:
                candidate.result = self._live_identity(candidate.live)
            else:
                cold.append(candidate)
        if cold:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(self.concurrency, len(cold))):
                    group.create_task(self._worker(cold))
        # Cancellation checkpoint: once all cold work has settled. An abort seen anywhere never yields
        # a result, even when every row came from the live store or the cache (no observation ran).
        self.raise_if_aborted()
        if any(candidate.result is _Outcome.CANCELLED for candidate in candidates):
            raise _cancelled()

    def _live_identity(self, session: Session) -> _Result:
        """Rung 1: the live registry's snapshot; an identity replayed from the fork seed is no value."""
        try:
            snapshot = self.projections.snapshot(session, _KEYS)
            value = snapshot.values.get(SUBAGENT_KEY)
            identity = None if value is None else SubagentIdentity.from_view(value)
        except Exception:
            return _Outcome.UNIT_RAISED
        if identity is None or not session.is_own_seq(identity.seq):
            return _Outcome.NO_VALUE
        return _Found(identity, 1)

    async def _worker(self, queue: deque[_Candidate]) -> None:
        # Workers record outcomes in their candidate's slot and never raise (only a cancellation of
        # their own task propagates), so the TaskGroup never turns a per-child problem into an
        # ExceptionGroup. After an abort no new candidate starts; in-flight reads settle first.
        while queue and not self.aborted():
            candidate = queue.popleft()
            candidate.result = await self._cold(candidate.header)

    async def _cold(self, header: SessionHeader) -> _Result:
        if not header.is_seeded and self.cache is not None:
            found = await self._cached_identity(header)
            if found is not None:
                return found
        return await self._observed_identity(header)

    async def _cached_identity(self, header: SessionHeader) -> _Found | None:
        """Rung 2: the cache's checkpoint at cut 0; `None` falls through to the observation.

        Only unseeded children come here: for a seeded one the cut the cached identity needs is
        unknown without reading the body. With cut 0 every legal seq is the child's own, so there is
        no own-suffix check.
        """
        assert self.cache is not None
        try:
            snapshot = await self.cache.cached_snapshot(header, SessionLogOffset(0), _KEYS)
            if snapshot is None:
                return None
            value = snapshot.values.get(SUBAGENT_KEY)
            if value is None:
                return None
            return _Found(SubagentIdentity.from_view(value), 2)
        except asyncio.CancelledError:
            if not _stray():
                raise
            return None
        except Exception:
            # Derived data: any cache fault (a poisoned row included) falls through to the log.
            return None

    async def _observed_identity(self, header: SessionHeader) -> _Result:
        """Rung 3: one full observation, the lifecycle witness, the unit's fold and the own-suffix check."""
        # Cancellation checkpoint: an abort seen before this observation starts.
        if self.aborted():
            return _Outcome.CANCELLED
        self.observations += 1
        try:
            observation = await self.query.observe_session(header.id, signal=self.signal)
        except asyncio.CancelledError:
            if not _stray():
                raise
            return _Outcome.CANCELLED if self.aborted() else _Outcome.READ_FAILED
        except Exception:
            return _Outcome.CANCELLED if self.aborted() else _Outcome.READ_FAILED
        # Cancellation checkpoint: an abort seen while this observation was in flight.
        if self.aborted():
            return _Outcome.CANCELLED
        # The lifecycle witness: a different header means the id was deleted and republished between
        # enumeration and this read (docs/catalog.md#lifecycle-witness).
        if observation.header != header:
            return _Outcome.LIFECYCLE_CHANGED
        try:
            identity = folded_identity(self.projections, observation.events, observation.inherited_event_count)
        except Exception:
            return _Outcome.UNIT_RAISED
        if identity is None:
            return _Outcome.NO_VALUE
        return _Found(identity, 3)

    def row(self, candidate: _Candidate, parents: set[str]) -> SubagentListEntry | None:
        """Map one ladder outcome to a row, or None when the child is omitted (`_ROW_WITHOUT_IDENTITY`)."""
        header, result = candidate.header, candidate.result
        if isinstance(result, _Found):
            self.rungs[header.id] = result.rung
            identity = result.identity
            return SubagentChildRow(
                header.id,
                identity.mode,
                "running" if candidate.live is not None else "inactive",
                header.id in parents,
                label=identity.label,
            )
        # Every slot is filled once `resolve` returned without raising (an abort raises instead).
        assert result is not None
        assert result is not _Outcome.CANCELLED
        live_reason, cold_reason = _ROW_WITHOUT_IDENTITY[result]
        reason = live_reason if candidate.live is not None else cold_reason
        return None if reason is None else SubagentDiagnosticRow(header.id, reason)

    def report(self) -> ListingReport:
        return ListingReport(dict(self.rungs), self.observations, self.unlisted)


def folded_identity(
    projections: ProjectionRegistry, events: Sequence[SessionEvent], inherited_event_count: int
) -> SubagentIdentity | None:
    """The identity the `subagent` unit folds from a whole log, or None when it has none of its own.

    The fold the catalog's observed rung runs (docs/catalog.md#observed-identity): the unit's value
    over every event, kept only when its descriptor lies in the own suffix (an identity replayed
    from the fork seed is no value). `dsh doctor` uses the same function, so it calls a child
    `subagent-without-identity` exactly when the catalog would show it as a `corrupt` row.

    Raises:
        Exception: whatever the unit raised (a unit has no failure channel of its own).
    """
    restored = projections.restore({}, events, 0, _KEYS)
    value = restored.snapshot.values.get(SUBAGENT_KEY)
    identity = None if value is None else SubagentIdentity.from_view(value)
    if identity is None or identity.seq < inherited_event_count:
        return None
    return identity


def _order(header: SessionHeader) -> tuple[int, str]:
    return (header.created_at, header.id)


async def list_children(
    services: Services,
    parent_session_id: str,
    *,
    signal: AbortSignal | None = None,
    cold_read_concurrency: int = 4,
    ensure_units: Callable[[ProjectionRegistry], None] | None = None,
    report: Callable[[ListingReport], None] | None = None,
) -> list[SubagentListEntry]:
    """The direct subagent children of `parent_session_id`, ordered by `(createdAt, id)`.

    Raises:
        ConfigError: `CONFIG_INVALID` for a `cold_read_concurrency` that is not an int in 1..64.
        SubagentError: a missing required service (checked first, in order), the `subagent` unit
            missing from the registry (`SUBAGENT_CONTROL_UNITS_UNAVAILABLE`), or `CANCELLED`.
        Exception: a failure of the query corpus itself propagates unchanged.
    """
    listing = _Listing(services, signal or AbortSignal.none(), cold_read_concurrency, ensure_units)
    paired = await listing.enumerate((parent_session_id,))
    candidates = [
        _Candidate(header, live, SessionId(parent_session_id), 1)
        for header, live in paired
        if header.origin == "subagent"
    ]
    parents = await listing.subagent_parents(candidates)
    await listing.resolve(candidates)
    rows = [row for candidate in candidates if (row := listing.row(candidate, parents)) is not None]
    if report is not None:
        report(listing.report())
    return rows


async def list_descendants(
    services: Services,
    root_session_id: str,
    *,
    signal: AbortSignal | None = None,
    cold_read_concurrency: int = 4,
    ensure_units: Callable[[ProjectionRegistry], None] | None = None,
    report: Callable[[ListingReport], None] | None = None,
) -> list[SubagentDescendantEntry]:
    """Every subagent below `root_session_id`, in pre-order, with parent id and depth.

    The walk crosses ordinary sessions, one-shot children, omitted and diagnostic nodes (their
    subtrees are still listed) and is iterative, so a 10,000-deep chain is fine.

    Raises:
        ConfigError, SubagentError: as `list_children`.
    """
    listing = _Listing(services, signal or AbortSignal.none(), cold_read_concurrency, ensure_units)
    children = await _family(listing, root_session_id)
    positions: list[_Candidate] = []
    visited = {root_session_id}
    stack: list[tuple[SessionHeader, Session | None, str, int]] = [
        (header, live, root_session_id, 1) for header, live in reversed(children.get(root_session_id, []))
    ]
    while stack:
        header, live, parent_id, depth = stack.pop()
        if header.id in visited:
            continue
        visited.add(header.id)
        if header.origin == "subagent":
            positions.append(_Candidate(header, live, SessionId(parent_id), depth))
        stack.extend((h, lv, header.id, depth + 1) for h, lv in reversed(children.get(header.id, [])))
    # Every position's children are in the index already: `hasChildren` needs no further read.
    parents = _with_subagent_children([pair for kids in children.values() for pair in kids])
    await listing.resolve(positions)
    out: list[SubagentDescendantEntry] = []
    for candidate in positions:
        row = listing.row(candidate, parents)
        if row is not None:
            out.append(SubagentDescendantEntry(row, candidate.parent_id, candidate.depth))
    if report is not None:
        report(listing.report())
    return out


_LEVELS_BEFORE_FULL_READ: Final = 32
"""A descendant walk deeper than this reads the tree from one unfiltered corpus read instead."""

_Paired = tuple[SessionHeader, "Session | None"]


def _with_subagent_children(paired: Sequence[_Paired]) -> set[str]:
    """The parents of the subagent sessions in `paired` (a row's `hasChildren`)."""
    return {h.parent_session for h, _ in paired if h.origin == "subagent" and h.parent_session is not None}


async def _family(listing: _Listing, root: str) -> dict[str, list[_Paired]]:
    """Every paired record below `root`, by parent, siblings in `(createdAt, id)` order.

    One filtered read per level of the tree (docs/catalog.md#descendants): each level asks for the
    children of the ids the previous level found and that were never asked for, so a cycle in the
    parent links ends the walk, and every id the pre-order walk visits has its children here exactly
    as a whole-corpus index would give them. A tree deeper than `_LEVELS_BEFORE_FULL_READ` levels
    (a long chain) is read again from one unfiltered corpus read, which bounds the cost at one
    whole-store listing.
    """
    children: dict[str, list[_Paired]] = {}
    asked: set[str] = set()
    frontier = {root}
    while frontier:
        if listing.reads >= _LEVELS_BEFORE_FULL_READ:
            return await _whole_index(listing)
        asked |= frontier
        found = await listing.enumerate(frontier)
        frontier = set()
        for header, live in found:
            assert header.parent_session is not None
            children.setdefault(header.parent_session, []).append((header, live))
            if header.id not in asked:
                frontier.add(header.id)
    return children


async def _whole_index(listing: _Listing) -> dict[str, list[_Paired]]:
    """The parent index of the whole paired corpus, from one unfiltered read (between two abort checks)."""
    listing.raise_if_aborted()
    try:
        records = await listing.query.list_sessions(signal=listing.signal)
    except Exception:
        if listing.aborted():
            raise _cancelled() from None
        raise
    listing.raise_if_aborted()
    children: dict[str, list[_Paired]] = {}
    paired = []
    for record in records:
        live = listing.sessions.get(record.header.id)
        paired.append((live.header, live) if live is not None else (record.header, None))
    for header, live in sorted(paired, key=lambda pair: _order(pair[0])):
        if header.parent_session is not None:
            children.setdefault(header.parent_session, []).append((header, live))
    return children
