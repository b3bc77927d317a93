"""The coordinator's cold reader: list, revision, inspect, read_events and prepare.

Layer: persistence (private to the coordinator). `PersistenceCoordinator` serves its read and
resume paths (docs/architecture.md#read-path) through one `ColdReader`, handed the coordinator's
`CoordinatorState` at construction; the coordinator keeps the write side (store notifications,
write-behind, retirement and close). Concurrent `inspect`s of one id await one shared load whose
result enters the prepared LRU; a waiter that aborts or is cancelled never cancels the shared work
(docs/architecture.md#cancellation). Every backend call for one id runs under that id's FIFO lock;
the signal is checked before any backend call and after every read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from dsh.errors import ConfigError
from dsh.persistence._prepared import CoordinatorPreparedSession, Reservation, observation_of
from dsh.persistence._state import CoordinatorState, await_signal, check_signal
from dsh.persistence._validation import (
    THREAD_THRESHOLD,
    ValidatedLog,
    validate_log_async,
    validate_selection_async,
    validate_typed,
)
from dsh.persistence._writer import retrieve, run_shielded
from dsh.persistence.base import (
    DamagedSession,
    EventSlice,
    ParentFilter,
    PersistenceObservation,
    PreparedSession,
    Revision,
    SessionListing,
    StoredLog,
    StoredSessionInfo,
    check_parents,
    typed_reads_of,
)
from dsh.persistence.errors import SessionLiveError, SessionNotFoundError
from dsh.persistence.headers import read_stored_header
from dsh.session.events import KNOWN_EVENT_TYPES
from dsh.session.header import StoredHeaderError
from dsh.session.stored import StoredEvents

if TYPE_CHECKING:
    from dsh.abort import AbortSignal

__all__ = ["ColdReader"]

_log = logging.getLogger("dsh.persistence")


class ColdReader:
    """The read and resume paths of one `PersistenceCoordinator`, over the state it shares.

    Args:
        state: The coordinator's shared state (backend, store, locks, LRU, reservations, ...).
    """

    def __init__(self, state: CoordinatorState) -> None:
        self._state = state
        self._reported_damage: set[tuple[str, str]] = set()

    # ---------------------------------------------------------------- listing and revisions

    def _location(self, header: Any, location: str | None = None) -> str | None:
        if location is not None:
            return location
        try:
            return self._state.backend.locate(header)
        except Exception:
            return None

    async def list(
        self,
        *,
        parent_session: str | None = None,
        parents: Collection[str | None] | None = None,
        signal: AbortSignal | None = None,
    ) -> SessionListing:
        """Materialized sessions from stored header facts only, sorted by `(created_at, id)`.

        `parent_session` or `parents` (not both) restrict the rows to direct children; the backend
        answers the filter from its own data, and the validated headers are filtered again here, so
        a backend's index can cost time but never add a row. A stored header that cannot be read
        leaves its session out and lands in `damaged` (logged once per location and code); a
        failure of the backend itself fails the whole call.

        Raises:
            ConfigError: `CONFIG_INVALID` when both filters are given or `parents` is malformed.
        """
        wanted = _parent_filter(parent_session, parents)
        async with self._state.operation(signal, None):
            records, damaged = await self._state.backend.list_headers(parents=wanted)
            check_signal(signal, None)
        rows: list[StoredSessionInfo] = []
        damaged = list(damaged)
        for row in records:
            record, header = row.record, row.header
            if header is None:
                try:
                    # Validated here once; a backend that validated while listing hands its header over.
                    header, _cut = read_stored_header(record)
                except StoredHeaderError as error:
                    code = "SESSION_FORMAT_UNSUPPORTED" if error.version_problem else "SESSION_CORRUPT"
                    stored_id = record.get("id")
                    known_id = stored_id if type(stored_id) is str else None
                    location = self._location(record) or str(stored_id)
                    message = f"stored session header failed validation: {error}"
                    damaged.append(DamagedSession(location, code, message, session_id=known_id))
                    continue
            if wanted is not None and header.parent_session not in wanted:
                continue
            rows.append(StoredSessionInfo(header, row.revision))
        rows.sort(key=lambda row: (row.header.created_at, row.header.id))
        for item in damaged:
            key = (item.location, item.code)
            if key not in self._reported_damage:
                self._reported_damage.add(key)
                _log.warning(
                    "%s: stored session at %s is damaged (%s): %s", self._state.backend.name, *key, item.message
                )
        return SessionListing(rows, damaged)

    async def revision(self, session_id: str, *, signal: AbortSignal | None = None) -> Revision | None:
        """The current stored revision of the id, or None when nothing is stored."""
        async with self._state.operation(signal, session_id), self._state.locks.hold(session_id):
            check_signal(signal, session_id)
            revision = await self._state.backend.read_revision(session_id)
        check_signal(signal, session_id)
        return revision

    # ---------------------------------------------------------------- inspect

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """A non-mutating full read: the live view for a live id, else the balanced stored log.

        Raises:
            SessionNotFoundError, SessionCorruptionError, SessionFormatUnsupportedError,
            PersistenceIOError, OperationCancelledError, PersistenceClosedError.
        """
        async with self._state.operation(signal, session_id):
            live = self._state.sessions.get(session_id)
            if live is not None:
                return PersistenceObservation(
                    header=live.header,
                    events=live.events,
                    inherited_event_count=live.inherited_event_count,
                    revision=None,
                    live=True,
                    synthetic_tail=0,
                )
            await self._state.settle_retirements(session_id, signal, retry=False)
            task = self._state.loads.get(session_id)
            if task is None:
                task = asyncio.ensure_future(self._shared_load(session_id))
                self._state.loads[session_id] = task

                def done(finished: asyncio.Future[ValidatedLog]) -> None:
                    retrieve(finished)
                    if self._state.loads.get(session_id) is finished:
                        del self._state.loads[session_id]

                task.add_done_callback(done)
            validated = await await_signal(task, signal, session_id)
        check_signal(signal, session_id)
        return observation_of(validated)

    async def _shared_load(self, session_id: str) -> ValidatedLog:
        """One load shared by every concurrent `inspect` of the id; the result enters the LRU."""
        async with self._state.locks.hold(session_id):
            validated = await self._load_locked(session_id, None, take=False)
            self._state.lru.put(session_id, validated)
            return validated

    async def _load_locked(self, session_id: str, signal: AbortSignal | None, *, take: bool) -> ValidatedLog:
        """Reuse the ready LRU entry if its revision still holds, else load and validate (id lock held)."""
        entry = self._state.lru.pop(session_id) if take else self._state.lru.get(session_id)
        if entry is not None:
            revision = await self._state.backend.read_revision(session_id)
            check_signal(signal, session_id)
            if revision == entry.revision:
                return entry
            self._state.lru.pop(session_id)
        log = await self._state.backend.load(session_id)
        check_signal(signal, session_id)
        if log is None:
            raise SessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        return await validate_log_async(session_id, log, self._location(log.header, log.location))

    # ---------------------------------------------------------------- read_events

    async def read_events(
        self,
        session_id: str,
        *,
        types: Collection[str] | None = None,
        from_seq: int = 0,
        signal: AbortSignal | None = None,
    ) -> EventSlice:
        """A physical storage read: stored events with `seq >= from_seq` (typed when asked).

        No closers, no live view, no caching. The format refusal covers the whole log.

        Raises:
            ConfigError: `CONFIG_INVALID` for a negative `from_seq` or `types` that is not a
                collection of type names.
        """
        if not (type(from_seq) is int and from_seq >= 0):
            raise ConfigError("from_seq must be a non-negative integer")
        if types is not None and (isinstance(types, str) or not all(isinstance(t, str) for t in types)):
            raise ConfigError("types must be a collection of event type names")
        # Typed reads only where the backend declares them; elsewhere a full load is filtered below.
        typed_reads = typed_reads_of(self._state.backend) if types is not None else None
        typed = typed_reads is not None
        async with self._state.operation(signal, session_id):
            # Like `inspect`: a session disposed a moment ago may still be writing its last batch.
            await self._state.settle_retirements(session_id, signal, retry=False)
            async with self._state.locks.hold(session_id):
                check_signal(signal, session_id)
                if typed_reads is not None:
                    wanted = frozenset(types or ())
                    log = await typed_reads.load_typed(session_id, wanted, from_seq, KNOWN_EVENT_TYPES)
                else:
                    log = await self._state.backend.load(session_id)
            check_signal(signal, session_id)
            if log is None:
                raise SessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            return await self._slice(session_id, log, types, from_seq, typed=typed)

    async def _slice(
        self, session_id: str, log: StoredLog, types: Collection[str] | None, from_seq: int, *, typed: bool
    ) -> EventSlice:
        """Validate a read_events result: a typed selection, or a full log then filtered."""
        location = self._location(log.header, log.location)
        if typed:
            if len(log.events) > THREAD_THRESHOLD:
                checked = await asyncio.to_thread(validate_typed, session_id, log, types, from_seq, location)
            else:
                checked = validate_typed(session_id, log, types, from_seq, location)
            header, cut, next_seq, records = checked
            return EventSlice(header, cut, log.revision, next_seq, StoredEvents(records))
        header, cut, stored_count, events = await validate_selection_async(session_id, log, types, from_seq, location)
        return EventSlice(header, cut, log.revision, stored_count, events)

    # ---------------------------------------------------------------- prepare

    async def prepare(self, session_id: str, *, signal: AbortSignal | None = None) -> PreparedSession:
        """Reserve a stored session for resume: writer lock, durable repair, unpublished session.

        Raises:
            SessionLiveError: The id is live in this process.
            LeaseHeldError: Another process or host is the session's writer.
            SessionNotFoundError, SessionCorruptionError, SessionFormatUnsupportedError,
            PersistenceIOError, OperationCancelledError, PersistenceClosedError.
        """
        async with self._state.operation(signal, session_id):
            reservation = await self._reserve(session_id, signal)
            try:
                validated = await self._prepare_locked(reservation, signal)
                check_signal(signal, session_id)
                self._state.check_open()
                events = validated.events.materialize()
                cursor = len(events)
                session = self._state.sessions.prepare_restored(
                    validated.header, validated.inherited_event_count, events
                )
            except BaseException:
                await self._abandon(reservation)
                raise
            reservation.phase = "reserved"
            reservation.session = session
            reservation.cursor = cursor
            return CoordinatorPreparedSession(
                reservation,
                observation_of(validated),
                publish=self._state.sessions.publish,
                release=self._release_reservation,
            )

    async def _reserve(self, session_id: str, signal: AbortSignal | None) -> Reservation:
        """Wait for retirements and earlier reservations of the id, then hold a `committing` one."""
        while True:
            await self._state.settle_retirements(session_id, signal, retry=True)
            self._state.check_open()
            if self._state.sessions.get(session_id) is not None or any(s.id == session_id for s in self._state.live):
                raise SessionLiveError(f'cannot prepare session "{session_id}" while it is live', session_id=session_id)
            existing = self._state.reserved.get(session_id)
            if existing is None:
                break
            # A second prepare of a reserved id waits for its release.
            waiting = asyncio.ensure_future(existing.released.wait())
            try:
                await await_signal(waiting, signal, session_id)
            finally:
                waiting.cancel()
        reservation = Reservation(session_id)
        self._state.reserved[session_id] = reservation
        return reservation

    async def _prepare_locked(self, reservation: Reservation, signal: AbortSignal | None) -> ValidatedLog:
        """Under the id lock: take the writer, reuse or load the log, commit the repair if needed."""
        session_id = reservation.session_id
        async with self._state.locks.hold(session_id):
            check_signal(signal, session_id)
            if self._state.lru.get(session_id) is None and not await self._state.backend.exists(session_id):
                # Checked before the writer lock is taken: a file store's lock file is never removed
                # (docs/storage-format.md#writer-locks), so locking an id nobody stored would leave
                # one behind for nothing.
                raise SessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
            # Shielded: a cancelled prepare must still learn whether the lock was taken, so that
            # `_abandon` can release it; a lock taken and never released would block the id forever.
            reservation.acquiring = asyncio.ensure_future(self._acquire(reservation))
            await asyncio.shield(reservation.acquiring)
            validated = await self._load_locked(session_id, signal, take=True)
            reservation.validated = validated
            if validated.needs_repair:
                validated = await run_shielded(self._repair(validated, reservation))
        return validated

    async def _acquire(self, reservation: Reservation) -> None:
        reservation.fence = await self._state.backend.acquire(reservation.session_id)
        reservation.lock_held = True

    async def _repair(self, validated: ValidatedLog, reservation: Reservation) -> ValidatedLog:
        """Commit the torn-tail removal and closers durably (id lock held, shielded)."""
        header = validated.header.to_stored(validated.inherited_event_count)
        torn = validated.torn
        revision = await self._state.backend.commit_repair(header, torn, validated.closers, fence=reservation.fence)
        removed_bytes = torn.removed_bytes if torn is not None else 0
        removed_records = torn.removed_records if torn is not None else 0
        # One WARNING per repair (docs/storage-format.md#torn-tails-and-repair): what it removed
        # and what it appended, so a repair is never silent.
        _log.warning(
            '%s: repaired stored session "%s"%s: removed %d bytes holding %d complete records%s, '
            "appended %d closing events",
            self._state.backend.name,
            reservation.session_id,
            f" at {validated.location}" if validated.location else "",
            removed_bytes,
            removed_records,
            " (copied beside the log as <log>.torn-<epoch ms>)" if removed_records else "",
            len(validated.closers),
        )
        self._state.lru.pop(reservation.session_id)
        repaired = ValidatedLog(
            header=validated.header,
            inherited_event_count=validated.inherited_event_count,
            events=validated.events,
            revision=revision,
            torn=None,
            closers=(),
            stored_count=len(validated.events),
            location=validated.location,
        )
        reservation.validated = repaired
        return repaired

    async def _abandon(self, reservation: Reservation) -> None:
        """A failed or cancelled `prepare`: release the writer lock and end the reservation."""
        if reservation.acquiring is not None and not reservation.acquiring.done():
            await asyncio.wait({reservation.acquiring})
        errors: list[Exception] = []
        if reservation.lock_held:
            reservation.lock_held = False
            await self._state.release_lock(reservation.session_id, errors)
        for error in errors:
            _log.error(
                '%s: releasing the writer of "%s" failed: %s', self._state.backend.name, reservation.session_id, error
            )
        if self._state.reserved.get(reservation.session_id) is reservation:
            del self._state.reserved[reservation.session_id]
        reservation.released.set()

    async def _release_reservation(self, reservation: Reservation) -> None:
        """`PreparedSession.close()` of an unpublished session: retire it, keep its read, release."""
        if reservation.attached:
            return
        session = reservation.session
        if session is not None:
            # Later appends and publication of the abandoned session must fail, not fork the log.
            session.retire_unpublished()
        if self._state.closed:
            reservation.released.set()
            return
        errors: list[Exception] = []
        if reservation.lock_held:
            reservation.lock_held = False
            await self._state.release_lock(reservation.session_id, errors)
        if self._state.reserved.get(reservation.session_id) is reservation:
            del self._state.reserved[reservation.session_id]
            if reservation.validated is not None:
                self._state.lru.put(reservation.session_id, reservation.validated)
        reservation.released.set()
        if errors:
            raise errors[0]


def _parent_filter(parent_session: object, parents: object) -> ParentFilter | None:
    """The one parent filter of a `list` call (`parent_session=p` is `parents={p}`), validated and copied."""
    if parent_session is not None:
        if parents is not None:
            raise ConfigError("pass either parent_session or parents, not both")
        if type(parent_session) is not str:
            raise ConfigError(f"parent_session must be a session id, got {type(parent_session).__name__}")
        return frozenset({parent_session})
    return None if parents is None else check_parents(parents)
