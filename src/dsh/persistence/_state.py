"""The state the coordinator's write side and its cold reader share, and the guards both use.

Layer: persistence (private to the coordinator). `PersistenceCoordinator` owns the write side
(store notifications, write-behind, retirement, close) and hands one `CoordinatorState` to its
`ColdReader` (list, revision, inspect, read_events, prepare) at construction, so the two objects
share exactly this state and nothing else. The coordinator alone ends the lifecycle
(`begin_close`); both sides ask `check_open()` before they start work and count their calls with
`operation()`, which is how `close()` knows when in-flight reads are done.

Signals (docs/architecture.md#cancellation): a signal is checked before any backend call and after
every read; `await_signal` lets a waiter leave shared work without cancelling it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, TypeVar

from dsh.persistence._prepared import PreparedLRU, Reservation
from dsh.persistence._writer import KeyedLocks, SessionWriter
from dsh.persistence.base import StorageBackend
from dsh.persistence.errors import OperationCancelledError, PersistenceClosedError

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.persistence._validation import ValidatedLog
    from dsh.session.session import Session
    from dsh.session.store import SessionStore

__all__ = ["CoordinatorState", "await_signal", "cancelled", "check_signal"]

T = TypeVar("T")


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


# Mutable state, not a record: a plain slotted class (docs/architecture.md#import-cost).
class CoordinatorState:
    """Everything the write side and the cold reader of one coordinator share.

    Attributes:
        backend: The storage backend.
        sessions: The store whose sessions are live.
        lru: The ready prepared observations.
        locks: The per-id FIFO locks every backend call of an id runs under.
        live: The write controller of each live session.
        retiring: Running retirements (drain, then release the writer) by id.
        failed: Writers whose retirement failed; `close()` and `prepare` retry them.
        reserved: Preparations in progress and prepared, unpublished sessions, by id.
        loads: The shared load of each id that `inspect`s await.
        closed: Set by `begin_close()` (the coordinator's `close()`); never cleared.
        operations: Calls in flight (see `operation()`).
        idle: Set while no call is in flight.
    """

    __slots__ = (
        "backend",
        "closed",
        "failed",
        "idle",
        "live",
        "loads",
        "locks",
        "lru",
        "operations",
        "reserved",
        "retiring",
        "sessions",
    )

    def __init__(self, backend: StorageBackend, sessions: SessionStore, lru: PreparedLRU) -> None:
        self.backend = backend
        self.sessions = sessions
        self.lru = lru
        self.locks = KeyedLocks()
        self.live: dict[Session, SessionWriter] = {}
        self.retiring: dict[str, set[asyncio.Task[None]]] = {}
        self.failed: list[SessionWriter] = []
        self.reserved: dict[str, Reservation] = {}
        self.loads: dict[str, asyncio.Task[ValidatedLog]] = {}
        self.closed = False
        self.operations = 0
        self.idle = _set_event()

    # ---------------------------------------------------------------- lifecycle and guards

    def begin_close(self) -> None:
        """The one transition: from now on every new call is refused with `PERSISTENCE_CLOSED`."""
        self.closed = True

    def check_open(self) -> None:
        """Raise `PERSISTENCE_CLOSED` once `close()` started."""
        if self.closed:
            raise PersistenceClosedError("the persistence coordinator is closed")

    @contextlib.asynccontextmanager
    async def operation(self, signal: AbortSignal | None, session_id: str | None) -> AsyncIterator[None]:
        """Refuse after close and on a pre-aborted signal; count the call so `close()` awaits it."""
        self.check_open()
        check_signal(signal, session_id)
        self.operations += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.operations -= 1
            if not self.operations:
                self.idle.set()

    # ---------------------------------------------------------------- writer locks and retirements

    async def release_lock(self, session_id: str, errors: list[Exception]) -> None:
        """Release the backend's writer lock of the id (under the id lock), collecting a failure."""
        try:
            async with self.locks.hold(session_id):
                await self.backend.release(session_id)
        except Exception as error:
            errors.append(error)

    async def release_writer(self, writer: SessionWriter, errors: list[Exception]) -> None:
        """Release the writer lock a retired or closing writer still holds (after its init, which may take it)."""
        await writer.settle_init()
        if writer.lock_held:
            writer.lock_held = False
            await self.release_lock(writer.session_id, errors)

    def forget_retired(self, session_id: str, tasks: Iterable[asyncio.Task[None]]) -> None:
        """Drop finished retirements of the id (idempotent).

        A retirement's done callback calls this, and so does every loop that waits for retirements
        until none is left: on Python 3.12+ a gather of tasks that are done already completes at
        once, before their done callbacks have run, so such a loop must not count on them.
        """
        group = self.retiring.get(session_id)
        if group is None:
            return
        group.difference_update([task for task in tasks if task.done()])
        if not group:
            del self.retiring[session_id]

    async def settle_retirements(self, session_id: str, signal: AbortSignal | None, *, retry: bool) -> None:
        """Wait for retirements of the id; with `retry`, retry a failed one and raise its error."""
        while group := self.retiring.get(session_id):
            pending = tuple(group)
            waiting = asyncio.ensure_future(asyncio.gather(*pending, return_exceptions=True))
            await await_signal(waiting, signal, session_id)
            self.forget_retired(session_id, pending)
        if not retry:
            return
        for writer in [w for w in self.failed if w.session_id == session_id]:
            await writer.flush()
            self.failed.remove(writer)
            errors: list[Exception] = []
            await self.release_writer(writer, errors)
            if errors:
                raise errors[0]


def cancelled(reason: object, session_id: str | None) -> OperationCancelledError:
    """The error of an operation its signal aborted."""
    return OperationCancelledError(
        "the persistence operation was cancelled by its signal", reason=reason, session_id=session_id
    )


def check_signal(signal: AbortSignal | None, session_id: str | None) -> None:
    """Raise `OPERATION_CANCELLED` when the signal is aborted."""
    if signal is not None and signal.aborted:
        raise cancelled(signal.reason, session_id)


async def await_signal(future: asyncio.Future[T], signal: AbortSignal | None, session_id: str | None) -> T:
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
            waiter.set_exception(cancelled(reason, session_id))

    future.add_done_callback(settled)
    remove = signal.add_callback(aborted)
    try:
        return await waiter
    finally:
        remove()
        future.remove_done_callback(settled)
