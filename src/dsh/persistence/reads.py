"""The coordinator's read and resume paths: list, revision, inspect, read_events and prepare.

Layer: persistence. `ColdReads` is the half of `PersistenceCoordinator` that serves cold reads
(docs/architecture.md#read-path) and resume; the coordinator module holds the other half (store
notifications, the write path, retirement and close) and the shared state both halves use.
Concurrent `inspect`s of one id await one shared load whose result enters the prepared LRU; a waiter
that aborts or is cancelled never cancels the shared work (docs/architecture.md#cancellation). Every
backend call for one id runs under that id's FIFO lock; the signal is checked before any backend
call and after every read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any, TypeVar

from dsh.abort import AbortSignal
from dsh.errors import ConfigError
from dsh.persistence.base import (
    Capability,
    DamagedSession,
    EventSlice,
    PersistenceObservation,
    PreparedSession,
    Revision,
    SessionListing,
    StorageBackend,
    StoredLog,
    StoredSessionInfo,
)
from dsh.persistence.errors import (
    OperationCancelledError,
    PersistenceClosedError,
    SessionLiveError,
    SessionNotFoundError,
)
from dsh.persistence.pipeline import THREAD_THRESHOLD, ValidatedLog, select, validate_log_async, validate_typed
from dsh.persistence.prepared import CoordinatorPreparedSession, PreparedLRU, Reservation, observation_of
from dsh.persistence.writer import KeyedLocks, SessionWriter, run_shielded
from dsh.session.events import KNOWN_EVENT_TYPES
from dsh.session.header import SessionHeader, StoredHeaderError
from dsh.session.session import Session
from dsh.session.store import SessionStore
from dsh.session.stored import StoredEvents

__all__ = ["ColdReads"]

_log = logging.getLogger("dsh.persistence")

T = TypeVar("T")


def retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background task's outcome as seen (its failure is reported to its awaiters)."""
    if not task.cancelled():
        task.exception()


def _cancelled(reason: object, session_id: str | None) -> OperationCancelledError:
    return OperationCancelledError(
        "the persistence operation was cancelled by its signal", reason=reason, session_id=session_id
    )


class ColdReads:
    """Read and resume paths of `PersistenceCoordinator` (which defines the state used here)."""

    _backend: StorageBackend
    _sessions: SessionStore
    _locks: KeyedLocks
    _live: dict[Session, SessionWriter]
    _retiring: dict[str, set[asyncio.Task[None]]]
    _failed: list[SessionWriter]
    _reserved: dict[str, Reservation]
    _lru: PreparedLRU
    _loads: dict[str, asyncio.Task[ValidatedLog]]
    _reported_damage: set[tuple[str, str]]
    _closed: bool
    _operations: int
    _idle: asyncio.Event

    # ---------------------------------------------------------------- guards

    def _check_open(self) -> None:
        if self._closed:
            raise PersistenceClosedError("the persistence coordinator is closed")

    @staticmethod
    def _check_signal(signal: AbortSignal | None, session_id: str | None) -> None:
        if signal is not None and signal.aborted:
            raise _cancelled(signal.reason, session_id)

    @contextlib.asynccontextmanager
    async def _operation(self, signal: AbortSignal | None, session_id: str | None) -> AsyncIterator[None]:
        """Refuse after close and on a pre-aborted signal; count the call so `close()` awaits it."""
        self._check_open()
        self._check_signal(signal, session_id)
        self._operations += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._operations -= 1
            if not self._operations:
                self._idle.set()

    @staticmethod
    async def _await_signal(future: asyncio.Future[T], signal: AbortSignal | None, session_id: str | None) -> T:
        """Await shared work; an abort or a cancellation releases only this waiter, never the work."""
        if signal is None:
            return await asyncio.shield(future)
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def settled(done: asyncio.Future[T]) -> None:
            if waiter.done():
                return
            if done.cancelled():
                waiter.cancel()
            elif (error := done.exception()) is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(done.result())

        def aborted(reason: object) -> None:
            if not waiter.done():
                waiter.set_exception(_cancelled(reason, session_id))

        future.add_done_callback(settled)
        remove = signal.add_callback(aborted)
        try:
            return await waiter
        finally:
            remove()
            future.remove_done_callback(settled)

    # ---------------------------------------------------------------- writer locks and retirements

    async def _release_lock(self, session_id: str, errors: list[Exception]) -> None:
        try:
            async with self._locks.hold(session_id):
                await self._backend.release(session_id)
        except Exception as error:
            errors.append(error)

    async def _release_writer(self, writer: SessionWriter, errors: list[Exception]) -> None:
        if writer.lock_held:
            writer.lock_held = False
            await self._release_lock(writer.session_id, errors)

    async def _settle_retirements(self, session_id: str, signal: AbortSignal | None, *, retry: bool) -> None:
        """Wait for retirements of the id; with `retry`, retry a failed one and raise its error."""
        while group := self._retiring.get(session_id):
            waiting = asyncio.ensure_future(asyncio.gather(*group, return_exceptions=True))
            await self._await_signal(waiting, signal, session_id)
        if not retry:
            return
        for writer in [w for w in self._failed if w.session_id == session_id]:
            await writer.flush()
            self._failed.remove(writer)
            errors: list[Exception] = []
            await self._release_writer(writer, errors)
            if errors:
                raise errors[0]

    # ---------------------------------------------------------------- listing and revisions

    def _location(self, header: Any, location: str | None = None) -> str | None:
        if location is not None:
            return location
        try:
            return self._backend.locate(header)
        except Exception:
            return None

    async def list(self, *, parent_session: str | None = None, signal: AbortSignal | None = None) -> SessionListing:
        """Materialized sessions from stored header facts only, sorted by `(created_at, id)`.

        A stored header that cannot be read leaves its session out and lands in `damaged` (logged
        once per location and code); a failure of the backend itself fails the whole call.
        """
        async with self._operation(signal, None):
            records, damaged = await self._backend.list_headers(parent_session=parent_session)
            self._check_signal(signal, None)
        rows: list[StoredSessionInfo] = []
        damaged = list(damaged)
        for record, revision in records:
            try:
                header, _cut = SessionHeader.from_stored(record)
            except StoredHeaderError as error:
                code = "SESSION_FORMAT_UNSUPPORTED" if error.version_problem else "SESSION_CORRUPT"
                location = self._location(record) or str(record.get("id"))
                damaged.append(DamagedSession(location, code, f"stored session header failed validation: {error}"))
                continue
            if parent_session is not None and header.parent_session != parent_session:
                continue
            rows.append(StoredSessionInfo(header, revision))
        rows.sort(key=lambda row: (row.header.created_at, row.header.id))
        for item in damaged:
            key = (item.location, item.code)
            if key not in self._reported_damage:
                self._reported_damage.add(key)
                _log.warning("%s: stored session at %s is damaged (%s): %s", self._backend.name, *key, item.message)
        return SessionListing(rows, damaged)

    async def revision(self, session_id: str, *, signal: AbortSignal | None = None) -> Revision | None:
        """The current stored revision of the id, or None when nothing is stored."""
        async with self._operation(signal, session_id), self._locks.hold(session_id):
            self._check_signal(signal, session_id)
            revision = await self._backend.read_revision(session_id)
        self._check_signal(signal, session_id)
        return revision

    # ---------------------------------------------------------------- inspect

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """A non-mutating full read: the live view for a live id, else the balanced stored log.

        Raises:
            SessionNotFoundError, SessionCorruptionError, SessionFormatUnsupportedError,
            PersistenceIOError, OperationCancelledError, PersistenceClosedError.
        """
        async with self._operation(signal, session_id):
            live = self._sessions.get(session_id)
            if live is not None:
                return PersistenceObservation(
                    header=live.header,
                    events=live.events,
                    inherited_event_count=live.inherited_event_count,
                    revision=None,
                    live=True,
                    synthetic_tail=0,
                )
            await self._settle_retirements(session_id, signal, retry=False)
            task = self._loads.get(session_id)
            if task is None:
                task = asyncio.ensure_future(self._shared_load(session_id))
                self._loads[session_id] = task

                def done(finished: asyncio.Future[ValidatedLog]) -> None:
                    retrieve(finished)
                    if self._loads.get(session_id) is finished:
                        del self._loads[session_id]

                task.add_done_callback(done)
            validated = await self._await_signal(task, signal, session_id)
        self._check_signal(signal, session_id)
        return observation_of(validated)

    async def _shared_load(self, session_id: str) -> ValidatedLog:
        """One load shared by every concurrent `inspect` of the id; the result enters the LRU."""
        async with self._locks.hold(session_id):
            validated = await self._load_locked(session_id, None, take=False)
            self._lru.put(session_id, validated)
            return validated

    async def _load_locked(self, session_id: str, signal: AbortSignal | None, *, take: bool) -> ValidatedLog:
        """Reuse the ready LRU entry if its revision still holds, else load and validate (id lock held)."""
        entry = self._lru.pop(session_id) if take else self._lru.get(session_id)
        if entry is not None:
            revision = await self._backend.read_revision(session_id)
            self._check_signal(signal, session_id)
            if revision == entry.revision:
                return entry
            self._lru.pop(session_id)
        log = await self._backend.load(session_id)
        self._check_signal(signal, session_id)
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
        typed = types is not None and Capability.TYPED_READS in self._backend.capabilities
        async with self._operation(signal, session_id):
            # Like `inspect`: a session disposed a moment ago may still be writing its last batch.
            await self._settle_retirements(session_id, signal, retry=False)
            async with self._locks.hold(session_id):
                self._check_signal(signal, session_id)
                if typed:
                    wanted = frozenset(types or ())
                    log = await self._backend.load_typed(session_id, wanted, from_seq, KNOWN_EVENT_TYPES)
                else:
                    log = await self._backend.load(session_id)
            self._check_signal(signal, session_id)
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
        validated = await validate_log_async(session_id, log, location)
        return EventSlice(
            validated.header,
            validated.inherited_event_count,
            validated.revision,
            validated.stored_count,
            StoredEvents(select(log.events, types, from_seq)),
        )

    # ---------------------------------------------------------------- prepare

    async def prepare(self, session_id: str, *, signal: AbortSignal | None = None) -> PreparedSession:
        """Reserve a stored session for resume: writer lock, durable repair, unpublished session.

        Raises:
            SessionLiveError: The id is live in this process.
            LeaseHeldError: Another process or host is the session's writer.
            SessionNotFoundError, SessionCorruptionError, SessionFormatUnsupportedError,
            PersistenceIOError, OperationCancelledError, PersistenceClosedError.
        """
        async with self._operation(signal, session_id):
            reservation = await self._reserve(session_id, signal)
            try:
                validated = await self._prepare_locked(reservation, signal)
                self._check_signal(signal, session_id)
                self._check_open()
                events = validated.events.materialize()
                cursor = len(events)
                session = self._sessions.prepare_restored(validated.header, validated.inherited_event_count, events)
            except BaseException:
                await self._abandon(reservation)
                raise
            reservation.phase = "reserved"
            reservation.session = session
            reservation.cursor = cursor
            return CoordinatorPreparedSession(
                reservation,
                observation_of(validated),
                publish=self._sessions.publish,
                release=self._release_reservation,
            )

    async def _reserve(self, session_id: str, signal: AbortSignal | None) -> Reservation:
        """Wait for retirements and earlier reservations of the id, then hold a `committing` one."""
        while True:
            await self._settle_retirements(session_id, signal, retry=True)
            self._check_open()
            if self._sessions.get(session_id) is not None or any(s.id == session_id for s in self._live):
                raise SessionLiveError(f'cannot prepare session "{session_id}" while it is live', session_id=session_id)
            existing = self._reserved.get(session_id)
            if existing is None:
                break
            # A second prepare of a reserved id waits for its release.
            waiting = asyncio.ensure_future(existing.released.wait())
            try:
                await self._await_signal(waiting, signal, session_id)
            finally:
                waiting.cancel()
        reservation = Reservation(session_id)
        self._reserved[session_id] = reservation
        return reservation

    async def _prepare_locked(self, reservation: Reservation, signal: AbortSignal | None) -> ValidatedLog:
        """Under the id lock: take the writer, reuse or load the log, commit the repair if needed."""
        session_id = reservation.session_id
        async with self._locks.hold(session_id):
            self._check_signal(signal, session_id)
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
        reservation.fence = await self._backend.acquire(reservation.session_id)
        reservation.lock_held = True

    async def _repair(self, validated: ValidatedLog, reservation: Reservation) -> ValidatedLog:
        """Commit the torn-tail removal and closers durably (id lock held, shielded)."""
        header = validated.header.to_stored(validated.inherited_event_count)
        revision = await self._backend.commit_repair(header, validated.torn, validated.closers, fence=reservation.fence)
        self._lru.pop(reservation.session_id)
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
            await self._release_lock(reservation.session_id, errors)
        for error in errors:
            _log.error('%s: releasing the writer of "%s" failed: %s', self._backend.name, reservation.session_id, error)
        if self._reserved.get(reservation.session_id) is reservation:
            del self._reserved[reservation.session_id]
        reservation.released.set()

    async def _release_reservation(self, reservation: Reservation) -> None:
        """`PreparedSession.close()` of an unpublished session: retire it, keep its read, release."""
        if reservation.attached:
            return
        session = reservation.session
        if session is not None:
            # Later appends and publication of the abandoned session must fail, not fork the log.
            session.retire_unpublished()
        if self._closed:
            reservation.released.set()
            return
        errors: list[Exception] = []
        if reservation.lock_held:
            reservation.lock_held = False
            await self._release_lock(reservation.session_id, errors)
        if self._reserved.get(reservation.session_id) is reservation:
            del self._reserved[reservation.session_id]
            if reservation.validated is not None:
                self._lru.put(reservation.session_id, reservation.validated)
        reservation.released.set()
        if errors:
            raise errors[0]
