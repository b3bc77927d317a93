"""`SessionQuery`: the one read service for "which sessions exist" and "what does this one contain".

Layer: query (above session, persistence and projection; below subagent and the adapters). Every
consumer — the subagent listing (enumeration and its cold rung), history pages and lineage for the
HTTP API, web UI and CLI — reads sessions through it, so they all agree:

* the corpus (`list_sessions`) is live-preferred: a session published in this process's store
  replaces its persisted record wholesale, with no consistency check (docs/catalog.md#accepted-deviations);
* an observation (`observe_session`) of a live id is the live session itself (zero reads, no copy,
  persistence never consulted); a cold one is exactly one non-mutating `persistence.inspect`;
* history pages are message-aligned runs of the observed log, the tail page carrying projections.

The service is read-only and stateless: it never creates, publishes, resumes, appends to or repairs
a session, and it keeps no index, cache or memo between calls. Cancellation is cooperative through
an `AbortSignal` (docs/query.md#query-cancellation): argument errors come first, then every observed
abort wins over every other outcome, backend calls are never abandoned mid-flight, and asyncio task
cancellation propagates unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn

from dsh.errors import ConfigError
from dsh.persistence.base import check_parents
from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError, SessionNotFoundError
from dsh.projection.errors import ProjectionError
from dsh.query.errors import (
    ABORTED,
    CORRUPT_SESSION,
    INVALID_FILTER,
    INVALID_LINEAGE,
    PERSISTENCE_FAILED,
    SESSION_NOT_FOUND,
    SOURCE_CONFLICT,
    UNSUPPORTED_FORMAT,
    SessionQueryError,
)
from dsh.query.records import (
    HistoryPage,
    LineageNode,
    SessionCorpus,
    SessionFilter,
    SessionLineage,
    SessionObservation,
    SessionRecord,
)
from dsh.session.header import SessionHeader, SessionId
from dsh.session.store import SessionStore

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.persistence.base import DamagedSession, PersistenceObservation, SessionPersistence
    from dsh.projection.registry import ProjectionRegistry
    from dsh.projection.unit import ProjectionSnapshot
    from dsh.session.session import Session

__all__ = ["QueryConfig", "SessionQuery"]

_log = logging.getLogger(__name__)


def _is_int(value: object) -> bool:
    return type(value) is int


@dataclass(frozen=True, slots=True)
class QueryConfig:
    """Limits of the query service.

    Attributes:
        history_default_messages: Page size when `read_history` gets no `max_messages`
            (`1..history_max_messages`).
        history_max_messages: Largest accepted `max_messages` (>= 1; the HTTP API uses the same limit).

    Raises:
        ConfigError: `CONFIG_INVALID` for a non-integer (or `bool`) value, a value below 1, or a
            default above the maximum.
    """

    history_default_messages: int = 50
    history_max_messages: int = 200

    def __post_init__(self) -> None:
        maximum = self.history_max_messages
        if not (_is_int(maximum) and maximum >= 1):
            raise ConfigError(f"history_max_messages must be an integer >= 1, got {maximum!r}")
        default = self.history_default_messages
        if not (_is_int(default) and 1 <= default <= maximum):
            raise ConfigError(f"history_default_messages must be an integer between 1 and {maximum}, got {default!r}")


_DEFAULT_CONFIG: Final = QueryConfig()

LiveSnapshot = Callable[["Session"], "ProjectionSnapshot | None"]


@dataclass(frozen=True, slots=True)
class _Read:
    """An observation plus what a history page needs from the same instant."""

    observation: SessionObservation
    session: Session | None
    projections: ProjectionSnapshot | None


def _aborted(signal: AbortSignal, session_id: str | None) -> SessionQueryError:
    subject = "session query" if session_id is None else f'session query for "{session_id}"'
    return SessionQueryError(f"{subject} was aborted", code=ABORTED, session_id=session_id, reason=signal.reason)


def _checkpoint(signal: AbortSignal | None, session_id: str | None) -> None:
    """Raise `SESSION_QUERY_ABORTED` when the caller's signal has aborted."""
    if signal is not None and signal.aborted:
        raise _aborted(signal, session_id)


def _abort_wins(signal: AbortSignal | None, session_id: str | None, error: BaseException) -> None:
    """After a backend call failed: an observed abort overrides whatever the backend raised."""
    if signal is not None and signal.aborted:
        raise _aborted(signal, session_id) from error


def _inspect_failure(session_id: str, error: Exception) -> SessionQueryError:
    """Map an `inspect` failure to its query code, keeping the three read verdicts apart."""
    if isinstance(error, SessionNotFoundError):
        return SessionQueryError(f'session "{session_id}" not found', code=SESSION_NOT_FOUND, session_id=session_id)
    if isinstance(error, SessionCorruptionError):
        return SessionQueryError(
            f'stored session "{session_id}" is corrupt: {error}', code=CORRUPT_SESSION, session_id=session_id
        )
    if isinstance(error, SessionFormatUnsupportedError):
        return SessionQueryError(
            f'stored session "{session_id}" uses an unsupported log format: {error}',
            code=UNSUPPORTED_FORMAT,
            session_id=session_id,
        )
    return SessionQueryError(
        f'failed to inspect session "{session_id}": {error}', code=PERSISTENCE_FAILED, session_id=session_id
    )


def _check_cut(session_id: str, observed: PersistenceObservation) -> None:
    """The exact cut must fit the log and agree with the header's `is_seeded`."""
    cut = observed.inherited_event_count
    count = len(observed.events)
    if not (_is_int(cut) and 0 <= cut <= count):
        problem = f"inherited event count {cut!r} is outside the log of {count} events"
    elif observed.header.is_seeded != (cut > 0):
        problem = f"inherited event count {cut} contradicts isSeeded={str(observed.header.is_seeded).lower()}"
    else:
        return
    raise SessionQueryError(
        f'stored session "{session_id}" is corrupt: {problem}', code=CORRUPT_SESSION, session_id=session_id
    )


def _check_filter(filter: object) -> frozenset[str | None] | None:
    """The filter's parents, validated and copied (`SESSION_QUERY_INVALID_FILTER` when malformed)."""
    if not isinstance(filter, SessionFilter):
        raise SessionQueryError(f"filter must be a SessionFilter, got {type(filter).__name__}", code=INVALID_FILTER)
    if filter.parents is None:
        return None
    try:
        return check_parents(filter.parents)
    except ConfigError as error:
        raise SessionQueryError(f"invalid session filter: {error}", code=INVALID_FILTER) from error


def _not_found(session_id: str) -> NoReturn:
    raise SessionQueryError(f'session "{session_id}" not found', code=SESSION_NOT_FOUND, session_id=session_id)


class SessionQuery:
    """The live-preferred session read service (`Services.query`).

    Args:
        sessions: This process's session store (required): "live" means published in it.
        persistence: Stored sessions (optional; without it the corpus is live-only).
        projections: The projection registry (optional; only tail history pages use it).
        config: Paging limits.

    Raises:
        ConfigError: `CONFIG_INVALID` when `sessions` is missing or `config` is not a `QueryConfig`.
    """

    __slots__ = ("_config", "_persistence", "_projections", "_sessions")

    def __init__(
        self,
        sessions: SessionStore,
        persistence: SessionPersistence | None = None,
        *,
        projections: ProjectionRegistry | None = None,
        config: QueryConfig = _DEFAULT_CONFIG,
    ) -> None:
        if sessions is None:
            raise ConfigError("the session query requires a session store")
        if not isinstance(sessions, SessionStore):
            raise ConfigError(f"sessions must be a SessionStore, got {type(sessions).__name__}")
        if not isinstance(config, QueryConfig):
            raise ConfigError(f"config must be a QueryConfig, got {type(config).__name__}")
        self._sessions = sessions
        self._persistence = persistence
        self._projections = projections
        self._config = config

    @property
    def config(self) -> QueryConfig:
        """The paging limits this service enforces."""
        return self._config

    # ---------------------------------------------------------------- corpus

    async def list_sessions(self, signal: AbortSignal | None = None) -> SessionCorpus:
        """The canonical live-preferred corpus, newest `createdAt` first, then id ascending.

        One persistence listing (headers only, zero log reads) plus the store's published sessions.
        Unpublished (prepared) sessions and created-but-never-appended stored sessions are absent.
        The result is a list of records whose `unreadable` attribute carries the stored entries
        persistence could not list (they are in no record).

        Raises:
            SessionQueryError: `SESSION_QUERY_ABORTED`, `SESSION_QUERY_PERSISTENCE_FAILED` (a mounted
                persistence that fails never degrades to a live-only corpus), or
                `SESSION_QUERY_SOURCE_CONFLICT` (one id listed twice with different headers).
        """
        return await self._corpus(None, signal)

    async def filter_sessions(self, filter: SessionFilter, signal: AbortSignal | None = None) -> SessionCorpus:
        """The live-preferred corpus restricted by `filter`, in `list_sessions` order.

        With `parents`, persistence answers the filter from its own data (a parent index; zero log
        reads, and the headers of other sessions are not read where the backend can avoid it), and
        only the store's published sessions under those parents join it. A record is kept when its
        corpus header (the live one for a live session) names one of the parents. `unreadable`
        still carries every stored entry persistence could not list: their parents are unknown.
        `persisted` says whether the filtered stored listing held the id (a live session whose
        stored header names another parent is therefore `persisted=False` here).

        The filter is validated and copied before anything else, then the signal is checked: the
        same errors and cancellation rules as `list_sessions` follow.

        Raises:
            SessionQueryError: `SESSION_QUERY_INVALID_FILTER` (not a `SessionFilter`, or `parents`
                that is not a collection of ids and None), then the errors of `list_sessions`.
        """
        return await self._corpus(_check_filter(filter), signal)

    async def _corpus(self, parents: frozenset[str | None] | None, signal: AbortSignal | None) -> SessionCorpus:
        """The live-preferred corpus, restricted to `parents` when given (see `filter_sessions`)."""
        _checkpoint(signal, None)
        records: dict[str, SessionRecord] = {}
        unreadable: tuple[DamagedSession, ...] = ()
        persistence = self._persistence
        if persistence is not None:
            try:
                if parents is None:
                    listing = await persistence.list(signal=signal)
                else:
                    listing = await persistence.list(parents=parents, signal=signal)
            except Exception as error:
                _abort_wins(signal, None, error)
                raise SessionQueryError(
                    f"session persistence listing failed: {error}", code=PERSISTENCE_FAILED
                ) from error
            _checkpoint(signal, None)
            unreadable = tuple(listing.damaged)
            for row in listing.rows:
                header = row.header
                known = records.get(header.id)
                if known is None:
                    records[header.id] = SessionRecord(header, live=False, persisted=True)
                elif known.header != header:
                    # No live record can arbitrate between two stored lifecycles of one id.
                    raise SessionQueryError(
                        f'session source headers conflict for session "{header.id}"',
                        code=SOURCE_CONFLICT,
                        session_id=header.id,
                    )
        persisted = set(records)
        # The store is read after the await on purpose, so a session published while persistence
        # was listing is included. The live header replaces the stored one without any check.
        for session in self._sessions.list():
            records[session.id] = SessionRecord(session.header, live=True, persisted=session.id in persisted)
        kept: Iterable[SessionRecord] = records.values()
        if parents is not None:
            # A stored record is replaced by its live session, whose header decides.
            kept = [record for record in kept if record.header.parent_session in parents]
        ordered = sorted(kept, key=lambda record: (-record.header.created_at, record.header.id))
        return SessionCorpus(ordered, unreadable)

    # ---------------------------------------------------------------- observation

    async def observe_session(
        self, session_id: SessionId, signal: AbortSignal | None = None, *, expect: SessionHeader | None = None
    ) -> SessionObservation:
        """One body-carrying observation: header, events and the exact inherited cut.

        A live id is served from the live session without any await or copy, and persistence is
        never consulted for it. Otherwise exactly one `persistence.inspect` (no prior listing).

        Args:
            session_id: The session to observe.
            signal: Cooperative cancellation; forwarded to `inspect`.
            expect: A header the caller enumerated; the observed header must equal it on the nine
                lifecycle-witness fields.

        Raises:
            SessionQueryError: `SESSION_QUERY_ABORTED`, `SESSION_QUERY_SESSION_NOT_FOUND`,
                `SESSION_QUERY_CORRUPT_SESSION`, `SESSION_QUERY_UNSUPPORTED_FORMAT`,
                `SESSION_QUERY_PERSISTENCE_FAILED` or `SESSION_QUERY_SOURCE_CONFLICT` (`expect`).
        """
        read = await self._read(session_id, signal, expect, None)
        return read.observation

    async def _read(
        self,
        session_id: SessionId,
        signal: AbortSignal | None,
        expect: SessionHeader | None,
        live_snapshot: LiveSnapshot | None,
    ) -> _Read:
        """Observe `session_id`, live or cold; `live_snapshot` runs only when the live view is served."""
        _checkpoint(signal, session_id)
        session = self._sessions.get(session_id)
        if session is not None:
            read = _live_read(session, live_snapshot)
        else:
            read = await self._cold_read(session_id, signal, live_snapshot)
        if expect is not None:
            field = expect.witness_difference(read.observation.header)
            if field is not None:
                raise SessionQueryError(
                    f'session "{session_id}" changed lifecycle between listing and observation ({field})',
                    code=SOURCE_CONFLICT,
                    session_id=session_id,
                )
        return read

    async def _cold_read(
        self, session_id: SessionId, signal: AbortSignal | None, live_snapshot: LiveSnapshot | None
    ) -> _Read:
        """Exactly one `persistence.inspect`, no prior listing."""
        persistence = self._persistence
        if persistence is None:
            _not_found(session_id)
        try:
            # Not raced against the signal: the backend receives it and settles promptly, and
            # the call is awaited to the end so no read is abandoned mid-flight.
            observed = await persistence.inspect(session_id, signal=signal)
        except Exception as error:
            _abort_wins(signal, session_id, error)
            raise _inspect_failure(session_id, error) from error
        _checkpoint(signal, session_id)
        # Live wins: the id may have been published while the read was in flight.
        session = self._sessions.get(session_id)
        if session is not None:
            return _live_read(session, live_snapshot)
        _check_cut(session_id, observed)
        observation = SessionObservation(
            observed.header,
            observed.events,
            observed.inherited_event_count,
            live=observed.live,
            torn_tail=observed.torn_tail,
        )
        return _Read(observation, None, None)

    # ---------------------------------------------------------------- history

    async def read_history(
        self,
        session_id: SessionId,
        *,
        before_seq: int | None = None,
        max_messages: int | None = None,
        projection_keys: Sequence[str] | None = None,
        signal: AbortSignal | None = None,
    ) -> HistoryPage:
        """One message-aligned page of the session's log (tail page when `before_seq` is None).

        Arguments are validated before the signal is looked at and before any read. The tail page
        carries the projection snapshot of the observed log (live: `registry.snapshot`, taken in the
        same synchronous step as the events view; cold: one fold of the observed events). A
        `ProjectionError` there is logged and leaves `projections` None: the page is still served.

        Raises:
            SessionQueryError: `SESSION_QUERY_INVALID_WINDOW`, `SESSION_QUERY_INVALID_LIMIT`, and the
                errors of `observe_session`.
        """
        from dsh.query.history import check_before_seq, check_max_messages, page_bounds  # history pages only

        window = check_before_seq(before_seq)
        limit = check_max_messages(
            max_messages,
            default=self._config.history_default_messages,
            maximum=self._config.history_max_messages,
        )
        keys = None if projection_keys is None else tuple(projection_keys)
        registry = self._projections if window is None else None
        live_snapshot: LiveSnapshot | None = None
        if registry is not None:

            def live_snapshot(session: Session) -> ProjectionSnapshot | None:
                return _fail_soft(session.id, lambda: registry.snapshot(session, keys))

        read = await self._read(session_id, signal, None, live_snapshot)
        observation = read.observation
        projections = read.projections
        if registry is not None and read.session is None:
            events = observation.events
            projections = _fail_soft(session_id, lambda: registry.restore(None, events, 0, keys).snapshot)
        bounds = page_bounds(observation.events, window, limit)
        page_events = tuple(observation.events[index] for index in range(bounds.start, bounds.end))
        return HistoryPage(
            session_id=session_id,
            header=observation.header,
            inherited_event_count=observation.inherited_event_count,
            live=observation.live,
            events=page_events,
            has_more=bounds.has_more,
            next_before_seq=bounds.start if bounds.has_more else None,
            projections=projections,
        )

    # ---------------------------------------------------------------- lineage

    async def trace_session(self, session_id: SessionId, signal: AbortSignal | None = None) -> SessionLineage:
        """Where `session_id` sits in the `parentSession` tree, from one corpus listing.

        Iterative throughout, so a 10,000-deep chain never reaches the recursion limit.

        Raises:
            SessionQueryError: the errors of `list_sessions`, `SESSION_QUERY_SESSION_NOT_FOUND`, or
                `SESSION_QUERY_INVALID_LINEAGE` (a cycle in the ancestor links).
        """
        corpus = await self.list_sessions(signal)
        by_id = {record.header.id: record for record in corpus}
        target = by_id.get(session_id)
        if target is None:
            _not_found(session_id)
        ancestors, root, unresolved = _walk_ancestors(target, by_id)
        return SessionLineage(
            target=target,
            ancestors=ancestors,
            descendants=_descendants(target, corpus),
            complete=unresolved is None,
            root=root,
            unresolved_parent_id=unresolved,
        )


def _live_read(session: Session, live_snapshot: LiveSnapshot | None) -> _Read:
    # Built without any await: the events view is bounded at this instant, and the projection
    # snapshot (tail pages) is taken in the same synchronous step, so both describe one log length.
    observation = SessionObservation(session.header, session.events, session.inherited_event_count, live=True)
    projections = live_snapshot(session) if live_snapshot is not None else None
    return _Read(observation, session, projections)


def _fail_soft(session_id: str, compute: Callable[[], ProjectionSnapshot]) -> ProjectionSnapshot | None:
    """Compute a projection block; a `ProjectionError` is logged and yields None (the log is authoritative)."""
    try:
        return compute()
    except ProjectionError as error:
        _log.warning('history projections unavailable for session "%s": %s', session_id, error)
        return None


def _walk_ancestors(
    target: SessionRecord, by_id: Mapping[SessionId, SessionRecord]
) -> tuple[tuple[SessionRecord, ...], SessionRecord | None, SessionId | None]:
    """Follow `parentSession` links: `(ancestors, root when complete, first unresolved parent id)`."""
    ancestors: list[SessionRecord] = []
    seen = {target.header.id}
    current = target
    while True:
        parent_id = current.header.parent_session
        if parent_id is None:
            return tuple(ancestors), current, None
        if parent_id in seen:
            raise SessionQueryError(
                f'session lineage contains a cycle at "{parent_id}"',
                code=INVALID_LINEAGE,
                session_id=target.header.id,
            )
        parent = by_id.get(parent_id)
        if parent is None:
            return tuple(ancestors), None, parent_id
        seen.add(parent_id)
        ancestors.append(parent)
        current = parent


def _descendants(target: SessionRecord, corpus: Sequence[SessionRecord]) -> tuple[LineageNode, ...]:
    """The target's descendant forest over the whole corpus (every origin, forks included)."""
    index: dict[str, list[SessionRecord]] = {}
    for record in corpus:
        parent = record.header.parent_session
        if parent is not None:
            index.setdefault(parent, []).append(record)
    for siblings in index.values():
        siblings.sort(key=lambda record: (record.header.created_at, record.header.id))
    # Pre-order discovery with an explicit stack, then construction in reverse pre-order, which
    # builds every node after all of its descendants: no recursion at any depth.
    target_id = target.header.id
    visited = {target_id}
    order: list[SessionRecord] = []
    kids: dict[str, list[str]] = {}
    stack = [target]
    while stack:
        record = stack.pop()
        order.append(record)
        found = [child for child in index.get(record.header.id, ()) if child.header.id not in visited]
        visited.update(child.header.id for child in found)
        kids[record.header.id] = [child.header.id for child in found]
        stack.extend(reversed(found))
    built: dict[str, LineageNode] = {}
    for record in reversed(order):
        built[record.header.id] = LineageNode(record, tuple(built[child] for child in kids[record.header.id]))
    return built[target_id].children


# Shown under the name users import (docs/architecture.md#public-names).
SessionQuery.__module__ = "dsh"
QueryConfig.__module__ = "dsh.query"
