"""`PersistenceCoordinator`: the `SessionPersistence` service on top of one `StorageBackend`.

Layer: persistence. The coordinator owns orchestration; backends own storage. It subscribes to the
`SessionStore` notifications at construction: a publication attaches a prepared session or starts
the init of a fresh one (and may veto), every committed event goes to that session's write-behind
controller (`SessionWriter`), `flush` is the durability barrier and `disposed` retires the session
(drain, then release the writer lock) (docs/architecture.md#write-path). This module holds that
write side and the lifecycle (`open`, `close`); the read and resume paths (`list`, `inspect`,
`read_events`, `prepare`, `revision`) are served by a `ColdReader` that the coordinator builds over
the state both sides share (`CoordinatorState`). The private modules beside it: `_writer`
(write-behind, per-id locks), `_cold_reads` (the reader), `_state` (the shared state and guards),
`_validation` (the read pipeline) and `_prepared` (the prepared LRU and `PreparedSession`).

Ordering: every backend operation for one id runs under that id's FIFO lock, and serialized
operations never nest, so one id's appends, repairs, loads and lock changes happen in request
order while different ids never wait for each other. Mutating steps run shielded: a cancelled
caller never leaves a half-applied append or repair behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Final, Self

from dsh.errors import ConfigError
from dsh.persistence._cold_reads import ColdReader
from dsh.persistence._prepared import PreparedLRU, Reservation
from dsh.persistence._state import CoordinatorState
from dsh.persistence._writer import SessionWriter, Written, retrieve
from dsh.persistence.base import (
    Capability,
    EventSlice,
    PersistenceObservation,
    PreparedSession,
    Revision,
    SessionListing,
    StorageBackend,
    eager_appends_of,
)
from dsh.persistence.errors import (
    AppendConflictError,
    PersistenceClosedError,
    PersistenceIOError,
    SessionAlreadyExistsError,
)
from dsh.session.events import SessionEvent
from dsh.session.header import SessionHeader
from dsh.session.session import Session
from dsh.session.store import SessionStore, Unsubscribe
from dsh.timer import LoopTimer, Timer

if TYPE_CHECKING:
    from dsh.abort import AbortSignal

__all__ = ["PersistenceCoordinator"]

_log = logging.getLogger("dsh.persistence")

_MAX_DELAY_MS: Final = 2_147_483_647


class PersistenceCoordinator:
    """Write-behind persistence, cold reads and resume for the sessions of one `SessionStore`.

    Args:
        backend: The storage backend (opened by `open()` / `async with`).
        sessions: The store whose notifications drive writes; subscribed at construction, and every
            session already live is initialised as a fresh session.
        write_batch_max_delay_ms: The fixed batching window (1..2147483647 ms).
        prepared_cache_size: How many ready cold observations the LRU keeps (positive).
        timer: Schedules the batching window; the running loop's `call_later` by default.

    Raises:
        ConfigError: `CONFIG_INVALID` for an invalid window or cache size.
    """

    def __init__(
        self,
        backend: StorageBackend,
        sessions: SessionStore,
        *,
        write_batch_max_delay_ms: int = 200,
        prepared_cache_size: int = 5,
        timer: Timer | None = None,
    ) -> None:
        if not (type(write_batch_max_delay_ms) is int and 1 <= write_batch_max_delay_ms <= _MAX_DELAY_MS):
            raise ConfigError(f"write_batch_max_delay_ms must be an integer between 1 and {_MAX_DELAY_MS}")
        if not (type(prepared_cache_size) is int and prepared_cache_size >= 1):
            raise ConfigError("prepared_cache_size must be a positive integer")
        self._backend = backend
        self._eager = eager_appends_of(backend)
        self._sessions = sessions
        self._delay_ms = write_batch_max_delay_ms
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._state = CoordinatorState(backend, sessions, PreparedLRU(prepared_cache_size))
        self._reads = ColdReader(self._state)
        self._close_task: asyncio.Task[None] | None = None
        self._unsubscribe_created = sessions.on_created(self._on_created)
        self._unsubscribe_event: Unsubscribe = sessions.on_event(self._on_event)
        self._unsubscribe_flush = sessions.on_flush(self._on_flush)
        self._unsubscribe_disposed: Unsubscribe = sessions.on_disposed(self._on_disposed)
        for session in sessions.list():
            self._start_fresh(session)

    # ---------------------------------------------------------------- properties

    @property
    def backend(self) -> StorageBackend:
        """The storage backend."""
        return self._backend

    @property
    def closed(self) -> bool:
        """True once `close()` started."""
        return self._state.closed

    @property
    def prepared_cache(self) -> PreparedLRU:
        """The prepared-observation LRU (exposed for inspection in tests)."""
        return self._state.lru

    def locate(self, header: SessionHeader) -> str | None:
        """The artifact path of a session (JSONL), without I/O; None elsewhere."""
        return self._backend.locate(header.to_stored(1 if header.is_seeded else 0))

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Open the backend."""
        self._state.check_open()
        await self._backend.open()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop admitting, drain every writer, await queued operations, release writers, close the backend.

        Idempotent: a later call returns once the first one finished, without raising.

        Raises:
            ExceptionGroup: `"<backend> close failed"` with every failure collected on the way.
        """
        if self._close_task is not None:
            await asyncio.wait({self._close_task})
            return
        self._state.begin_close()
        self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        errors: list[Exception] = []
        for writer in list(self._state.live.values()):
            try:
                await writer.flush()
            except Exception as error:
                errors.append(error)
        while any(self._state.retiring.values()):
            pending = {session_id: tuple(group) for session_id, group in self._state.retiring.items()}
            await asyncio.gather(*(task for tasks in pending.values() for task in tasks), return_exceptions=True)
            for session_id, tasks in pending.items():
                self._state.forget_retired(session_id, tasks)
        for writer in list(self._state.failed):
            try:
                await writer.flush()
            except Exception as error:
                errors.append(error)
            else:
                self._state.failed.remove(writer)
                await self._state.release_writer(writer, errors)
        # Wake prepares waiting for a reservation: they re-check and fail with PERSISTENCE_CLOSED,
        # so waiting for in-flight operations cannot deadlock on an unclosed PreparedSession.
        for reservation in self._state.reserved.values():
            reservation.released.set()
        await self._state.idle.wait()
        if self._state.loads:
            await asyncio.gather(*self._state.loads.values(), return_exceptions=True)
        for writer in list(self._state.live.values()):
            await self._state.release_writer(writer, errors)
        self._state.live.clear()
        for reservation in list(self._state.reserved.values()):
            if reservation.lock_held:
                reservation.lock_held = False
                await self._state.release_lock(reservation.session_id, errors)
            reservation.released.set()
        self._state.reserved.clear()
        self._state.lru.clear()
        # `created` and `flush` stay subscribed: they refuse with PERSISTENCE_CLOSED, so a publication
        # is vetoed and a durability barrier never silently succeeds; events are no longer taken.
        self._unsubscribe_event()
        self._unsubscribe_disposed()
        try:
            await self._backend.close()
        except Exception as error:
            errors.append(error)
        if errors:
            raise ExceptionGroup(f"{self._backend.name} close failed", errors)

    # ---------------------------------------------------------------- store notifications

    def _on_created(self, session: Session) -> None:
        """Attach a prepared session, veto an identity persistence owns, or start a fresh init."""
        if self._state.closed:
            raise PersistenceClosedError(
                f'cannot publish session "{session.id}": the persistence coordinator is closed',
                session_id=session.id,
            )
        reservation = self._state.reserved.get(session.id)
        if reservation is not None and reservation.session is session:
            self._attach(reservation, session)
            return
        if reservation is not None or session.id in self._state.lru:
            raise SessionAlreadyExistsError(
                f'cannot publish session "{session.id}": persisted state already owns this identity',
                session_id=session.id,
            )
        self._start_fresh(session)

    def _attach(self, reservation: Reservation, session: Session) -> None:
        """Hand a prepared session's reservation (cursor, writer lock) over to a live writer."""
        if reservation.cursor != session.first_live_seq:
            raise AppendConflictError(
                f'session "{session.id}" preparation no longer matches its persistence state', session_id=session.id
            )
        writer = self._new_writer(
            session,
            init=None,
            cursor=reservation.cursor,
            materialized=True,
            fence=reservation.fence,
            lock_held=reservation.lock_held,
        )
        reservation.attached = True
        reservation.lock_held = False  # now the live writer's, released at retirement
        del self._state.reserved[session.id]
        reservation.released.set()
        self._state.lru.pop(session.id)
        self._state.live[session] = writer
        # The unpublished suffix: the constructor's `session/end-seed` and pre-publication appends.
        writer.enqueue_many(session.events[session.first_live_seq :])

    def _start_fresh(self, session: Session) -> None:
        """A fresh session: its events so far (seed, end-seed, pre-publication appends) are the first batch."""
        previous = tuple(self._state.retiring.get(session.id, ()))
        writer = self._new_writer(session, init=self._init_fresh, previous=previous)
        self._state.live[session] = writer
        writer.start_init()
        writer.enqueue_many(session.events[:])

    def _new_writer(self, session: Session, **state: Any) -> SessionWriter:
        return SessionWriter(
            session,
            backend_name=self._backend.name,
            timer=self._timer,
            delay_ms=self._delay_ms,
            sink=self._sink,
            start_write=None if self._eager is None else self._start_eager,
            **state,
        )

    def _on_event(self, session: Session, event: SessionEvent) -> None:
        writer = self._state.live.get(session)
        if writer is not None:
            writer.enqueue(event)

    async def _on_flush(self, session: Session) -> None:
        self._state.check_open()
        writer = self._state.live.get(session)
        if writer is not None:
            await writer.flush()

    def _on_disposed(self, session: Session) -> None:
        writer = self._state.live.pop(session, None)
        if writer is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._retire(writer), name=f"dsh-retire-{session.id}")
        except RuntimeError:
            # Disposed from synchronous code with no loop: `close()` retries the retirement.
            self._state.failed.append(writer)
            return
        self._state.retiring.setdefault(session.id, set()).add(task)

        def done(finished: asyncio.Task[None]) -> None:
            retrieve(finished)
            self._state.forget_retired(session.id, (finished,))

        task.add_done_callback(done)

    # ---------------------------------------------------------------- write path

    async def _init_fresh(self, writer: SessionWriter) -> None:
        """Init of a fresh session: after earlier retirements of the id, refuse a stored id."""
        session_id = writer.session_id
        if writer.previous:
            await asyncio.gather(*writer.previous, return_exceptions=True)
        if any(failed.session_id == session_id for failed in self._state.failed):
            raise SessionAlreadyExistsError(
                f'cannot persist session "{session_id}": an earlier session with this id still holds unwritten events',
                session_id=session_id,
            )
        async with self._state.locks.hold(session_id):
            if await self._backend.exists(session_id):
                raise SessionAlreadyExistsError(
                    f'cannot persist new session "{session_id}": {self._backend.name} storage already holds '
                    "this id (resume it with prepare instead)",
                    session_id=session_id,
                )
            if Capability.LEASES in self._backend.capabilities:
                writer.fence = await self._backend.acquire(session_id)
                writer.lock_held = True

    def _start_eager(self, writer: SessionWriter, batch: list[SessionEvent], written: Written) -> bool:
        """Start an ordinary append without awaiting it (see `SessionWriter`); False leaves it to `_sink`.

        Only for a materialized session whose writer lock this process holds, when the id lock is
        free right now and the batch continues the stored cursor; the id lock is held until the
        backend reports back, exactly as `_sink` holds it across its await.
        """
        eager = self._eager
        session_id = writer.session_id
        if (
            eager is None
            or not writer.materialized
            or not writer.lock_held
            or batch[0].seq != writer.cursor
            or not self._state.locks.try_acquire(session_id)
        ):
            return False

        def done(error: BaseException | None) -> None:
            if error is None:
                writer.cursor = batch[-1].seq + 1
                self._state.lru.pop(session_id)
            self._state.locks.release(session_id)
            written(error)

        try:
            eager.start_append(writer.stored_header, batch, fence=writer.fence, done=done)
        except Exception:
            # Not handed over (a closed or read-only backend): `_sink` reports it the usual way.
            self._state.locks.release(session_id)
            return False
        return True

    async def _sink(self, writer: SessionWriter, batch: list[SessionEvent]) -> None:
        """Write one batch under the id lock (runs in the writer's pump; see `SessionWriter`)."""
        session_id = writer.session_id
        locks = self._state.locks
        await locks.acquire(session_id)
        try:
            skip = writer.cursor - batch[0].seq
            events = batch[skip:] if skip > 0 else batch
            if not events:
                return
            if not writer.materialized and not writer.lock_held:
                # JSONL and SQLite take the writer lock when the session first materializes.
                writer.fence = await self._backend.acquire(session_id)
                writer.lock_held = True
            await self._backend.append_batch(
                writer.stored_header, events, materialized=writer.materialized, fence=writer.fence
            )
            writer.cursor = events[-1].seq + 1
            writer.materialized = True
            self._state.lru.pop(session_id)
        finally:
            locks.release(session_id)

    # ---------------------------------------------------------------- retirement and drain

    async def _retire(self, writer: SessionWriter) -> None:
        try:
            await writer.flush()
        except Exception as error:
            _log.error('%s: session "%s" retirement failed: %s', self._backend.name, writer.session_id, error)
            self._state.failed.append(writer)
            return
        errors: list[Exception] = []
        await self._state.release_writer(writer, errors)
        for failure in errors:
            _log.error('%s: session "%s" retirement failed: %s', self._backend.name, writer.session_id, failure)

    async def settle_init(self, session_id: str) -> None:
        """Wait until the started init of the id's live writer finished (never raises).

        A new session's init takes its writer lock or lease (PostgreSQL); `dsh serve` replicas wait
        for it before answering a creation, so the other replicas find the session's holder.
        """
        for writer in [w for s, w in self._state.live.items() if s.id == session_id]:
            await writer.settle_init()

    async def drain(self, session_id: str) -> None:
        """Wait until every event handed over for the id is durable or has failed.

        A live session is flushed; a retiring one is awaited. When events of the id are still
        buffered because a write failed, the failure is raised, so a caller that must only act on
        durable events (the projection cache) can tell.

        Raises:
            SessionPersistenceError: The first write failure of a live or retired writer of the id.
        """
        self._state.check_open()
        failure: Exception | None = None
        for writer in [w for s, w in self._state.live.items() if s.id == session_id]:
            try:
                await writer.flush()
            except Exception as error:
                failure = failure or error
        group = self._state.retiring.get(session_id)
        if group:
            await asyncio.gather(*group, return_exceptions=True)
        if failure is not None:
            raise failure
        if any(writer.session_id == session_id for writer in self._state.failed):
            raise PersistenceIOError(
                f'{self._backend.name}: session "{session_id}" still holds events that could not be made durable',
                session_id=session_id,
            )

    # ---------------------------------------------------------------- reads and resume (the cold reader)
    # Served by the `ColdReader`. Kept last in the class: the method `list` would shadow the builtin
    # in the type annotations of any method defined after it.

    async def list(
        self,
        *,
        parent_session: str | None = None,
        parents: Collection[str | None] | None = None,
        signal: AbortSignal | None = None,
    ) -> SessionListing:
        """Materialized sessions from stored header facts only, sorted by `(created_at, id)`.

        `parent_session` or `parents` (not both) keep direct children only, answered from the
        backend's own data (the SQL parent index, the JSONL parent index when it is fresh). A
        stored header that cannot be read leaves its session out and lands in `damaged` (logged
        once per location and code; always for the whole store); a failure of the backend itself
        fails the whole call.

        Raises:
            ConfigError: `CONFIG_INVALID` when both filters are given or `parents` is malformed.
        """
        return await self._reads.list(parent_session=parent_session, parents=parents, signal=signal)

    async def revision(self, session_id: str, *, signal: AbortSignal | None = None) -> Revision | None:
        """The current stored revision of the id, or None when nothing is stored."""
        return await self._reads.revision(session_id, signal=signal)

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """A non-mutating full read: the live view for a live id, else the balanced stored log.

        Raises:
            SessionNotFoundError, SessionCorruptionError, SessionFormatUnsupportedError,
            PersistenceIOError, OperationCancelledError, PersistenceClosedError.
        """
        return await self._reads.inspect(session_id, signal=signal)

    async def read_events(
        self,
        session_id: str,
        *,
        types: Collection[str] | None = None,
        from_seq: int = 0,
        signal: AbortSignal | None = None,
    ) -> EventSlice:
        """A physical storage read: stored events with `seq >= from_seq` (typed when asked).

        No closers, no live view, no caching. The format refusal covers the whole log. A backend
        that declares `TYPED_READS` reads only the asked types; elsewhere the whole log is loaded
        and filtered.

        Raises:
            ConfigError: `CONFIG_INVALID` for a negative `from_seq` or `types` that is not a
                collection of type names.
        """
        return await self._reads.read_events(session_id, types=types, from_seq=from_seq, signal=signal)

    async def prepare(self, session_id: str, *, signal: AbortSignal | None = None) -> PreparedSession:
        """Reserve a stored session for resume: writer lock, durable repair, unpublished session.

        Raises:
            SessionLiveError: The id is live in this process.
            LeaseHeldError: Another process or host is the session's writer.
            SessionNotFoundError, SessionCorruptionError, SessionFormatUnsupportedError,
            PersistenceIOError, OperationCancelledError, PersistenceClosedError.
        """
        return await self._reads.prepare(session_id, signal=signal)


# Shown under the name users import (docs/architecture.md#public-names).
PersistenceCoordinator.__module__ = "dsh"
