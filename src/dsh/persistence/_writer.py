"""Write-behind for one live session, per-id FIFO locks, and shielded mutations.

Layer: persistence (private to the coordinator). A `SessionWriter` buffers the events of one live
session and hands batches to the coordinator, which appends them under the id lock: eagerly (the
backend's writer thread takes the batch before anything awaits) or through the *sink* coroutine
(docs/architecture.md#write-path). Rules:

* **Fixed, non-sliding window**: the first pending event arms the injected timer; later events do
  not extend it (bounded coalescing, not debounce). At expiry the whole pending prefix becomes one
  batch. At most one write is active; a batch due while a write runs starts when it settles.
* **Flush barrier**: cancels the window and writes until the queue is empty, including events
  admitted meanwhile; concurrent flushes share one barrier; the barrier clears in the step that
  saw the empty queue, so a later event opens a new window.
* **Failure retention**: a failed batch goes back in front of newer events; the window is
  cancelled and automatic writing pauses until the next enqueue or an explicit flush. A background
  failure is logged once; there is no retry loop. Retries never duplicate or skip seqs because the
  backend checks the first seq and rolls back a failed append.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dsh.json import FrozenDict
from dsh.persistence.base import Fence
from dsh.session.events import SessionEvent

if TYPE_CHECKING:
    from dsh.session.session import Session
    from dsh.timer import Timer, TimerHandle

__all__ = ["KeyedLocks", "SessionWriter", "retrieve", "run_shielded"]

_log = logging.getLogger("dsh.persistence")

T = TypeVar("T")


def retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background task's outcome as seen (its failure is reported to its awaiters or logged)."""
    if not task.cancelled():
        task.exception()


async def run_shielded(coro: Coroutine[Any, Any, T]) -> T:
    """Run a mutating step to completion even if the caller is cancelled.

    The step runs as its own task: once started, an append or a repair is never abandoned
    half-way, so cancellation can never leave half-applied state. A cancelled caller still gets
    `CancelledError`; the step finishes on its own and does its own bookkeeping.
    """
    task = asyncio.ensure_future(coro)
    task.add_done_callback(retrieve)
    return await asyncio.shield(task)


class _KeyedLock:
    """One key's FIFO lock: held or not, and the futures of the waiters in arrival order."""

    __slots__ = ("held", "users", "waiters")

    def __init__(self) -> None:
        self.held = False
        self.users = 0
        self.waiters: deque[asyncio.Future[None]] = deque()


class KeyedLocks:
    """FIFO locks keyed by session id, created on demand and dropped when idle.

    Waiters are served in arrival order, so the operations of one id run in the order they were
    requested; a failure inside one only releases the lock, it never poisons the queue. Different ids
    never wait for each other. An uncontended `acquire` never suspends, and `try_acquire` takes a free
    lock without awaiting at all (the eager write path, which starts its write before it suspends).
    """

    def __init__(self) -> None:
        self._locks: dict[str, _KeyedLock] = {}

    def try_acquire(self, key: str) -> bool:
        """Take the lock of `key` now if nobody holds or awaits it; False (and nothing changed) otherwise."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _KeyedLock()
        elif entry.held or entry.waiters:
            return False
        entry.held = True
        entry.users += 1
        return True

    async def acquire(self, key: str) -> None:
        """Take the lock of `key`, waiting behind earlier callers (pair every success with one `release`)."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _KeyedLock()
        entry.users += 1
        if not entry.held and not entry.waiters:
            entry.held = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # The lock was handed over just as this caller was cancelled: pass it on.
                self._hand_over(entry)
            else:
                entry.waiters.remove(waiter)
            self._leave(key, entry)
            raise

    def release(self, key: str) -> None:
        """Release the lock of `key` taken by `acquire` or `try_acquire`: the next waiter gets it."""
        entry = self._locks[key]
        self._hand_over(entry)
        self._leave(key, entry)

    @staticmethod
    def _hand_over(entry: _KeyedLock) -> None:
        while entry.waiters:
            waiter = entry.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the lock stays held: it now belongs to that waiter
                return
        entry.held = False

    def _leave(self, key: str, entry: _KeyedLock) -> None:
        entry.users -= 1
        if entry.users == 0 and self._locks.get(key) is entry:
            del self._locks[key]

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold the lock of `key` for the body of an `async with`."""
        await self.acquire(key)
        try:
            yield
        finally:
            self.release(key)

    def __len__(self) -> int:
        return len(self._locks)


Sink = Callable[["SessionWriter", list[SessionEvent]], Coroutine[Any, Any, None]]
Init = Callable[["SessionWriter"], Coroutine[Any, Any, None]]
Written = Callable[[BaseException | None], None]
StartWrite = Callable[["SessionWriter", list[SessionEvent], Written], bool]


class SessionWriter:
    """The write controller of one live session, plus that session's persistence state.

    Args:
        session: The live session.
        backend_name: For log lines.
        timer: Schedules the batching window.
        delay_ms: The window length.
        sink: Writes one batch (the coordinator: under the id lock, via `append_batch`).
        init: Runs once before the first write of a fresh session (None when already initialised,
            e.g. a resumed session attached from a preparation).
        start_write: Starts one batch's write without awaiting it when it can (the coordinator's
            eager path) and reports its outcome to the given callback; returns False, changing
            nothing, when the batch must go through `sink` instead. None: always `sink`.
        cursor: The stored next seq.
        materialized: Whether the session is stored already.
        fence: The writer fence, when one is held.
        lock_held: Whether this writer holds the backend's writer lock or lease.

    Attributes:
        cursor: The stored length (= next seq) of the session's log.
        materialized: Whether anything is stored for the session.
        fence: The lease fence (PostgreSQL), else None.
        lock_held: Whether `acquire` succeeded for this writer (released at retirement).
        previous: Retirements of the same id that were running when this session was published;
            the init waits for them.

    A batch is written one of two ways, never two at once. The *eager* way: `start_write` hands the
    batch to the backend's writer thread right where the write falls due (in `flush`, or in the
    window's timer callback) and its callback, run on the loop, records the outcome and starts the
    next batch or resolves the flush. The *pump* (a task per burst, running `sink`) takes everything
    else: the init, the first write that materializes the log and takes the writer lock, a busy id
    lock, backends without eager appends. Neither can be interrupted by a caller: flush callers wait
    on futures of their own, so a cancelled caller never stops a write half-way — the write and its
    bookkeeping always happen together (docs/architecture.md#from-append-to-the-acknowledgement).
    """

    def __init__(
        self,
        session: Session,
        *,
        backend_name: str,
        timer: Timer,
        delay_ms: int,
        sink: Sink,
        init: Init | None,
        start_write: StartWrite | None = None,
        cursor: int = 0,
        materialized: bool = False,
        fence: Fence | None = None,
        lock_held: bool = False,
        previous: Sequence[asyncio.Future[Any]] = (),
    ) -> None:
        self.session = session
        self.session_id: str = session.id
        self.cursor = cursor
        self.materialized = materialized
        self.fence = fence
        self.lock_held = lock_held
        self.previous = tuple(previous)
        self._stored_header: FrozenDict | None = None
        self._backend_name = backend_name
        self._timer = timer
        self._delay_ms = delay_ms
        self._sink = sink
        self._start_write = start_write
        self._init = init
        self._init_task: asyncio.Future[None] | None = None
        self._init_error: Exception | None = None
        self._pending: list[SessionEvent] = []
        self._handle: TimerHandle | None = None
        self._due = False
        self._pump: asyncio.Task[None] | None = None
        self._eager = False  # an eager write is in flight
        # The flush barrier: None when no barrier runs, else the futures of the callers waiting on it.
        self._waiters: list[asyncio.Future[None]] | None = None

    @property
    def stored_header(self) -> FrozenDict:
        """The stored header record every batch carries (computed once)."""
        if self._stored_header is None:
            self._stored_header = self.session.header.to_stored(self.session.inherited_event_count)
        return self._stored_header

    @property
    def pending(self) -> int:
        """How many events are buffered and not yet durable."""
        return len(self._pending)

    @property
    def init_error(self) -> Exception | None:
        """The stored init failure, re-raised by every flush."""
        return self._init_error

    def start_init(self) -> None:
        """Start the init now when a loop runs (otherwise the first write starts it)."""
        if self._init is None or self._init_task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._init_task = loop.create_task(self._init(self), name=f"dsh-init-{self.session_id}")
        self._init_task.add_done_callback(retrieve)

    async def settle_init(self) -> None:
        """Wait until a started init has finished (it may take the writer lock or lease); never raises."""
        task = self._init_task
        if task is not None and not task.done():
            await asyncio.wait({task})

    # ---------------------------------------------------------------- admission

    def enqueue(self, event: SessionEvent) -> None:
        """Buffer one committed event (events are immutable: no copy)."""
        self._pending.append(event)
        # While a barrier runs it writes everything admitted; a failed init keeps events in memory
        # and only flushes (which re-raise it) touch them; otherwise the first pending event opens
        # the fixed window and later ones never extend it.
        if self._handle is None and not self._due and self._waiters is None and self._init_error is None:
            self._open_window()

    def enqueue_many(self, events: Sequence[SessionEvent]) -> None:
        """Buffer several committed events in order."""
        if events:
            self._pending.extend(events)
            if self._handle is None and not self._due and self._waiters is None and self._init_error is None:
                self._open_window()

    def _open_window(self) -> None:
        try:
            self._handle = self._timer.call_later(self._delay_ms, self._expire)
        except RuntimeError:
            # No running loop (an append from synchronous code): the events wait for the next
            # enqueue on the loop or for a flush.
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        self._due = True
        self._write_next()

    def _cancel_window(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._due = False

    # ---------------------------------------------------------------- barrier

    async def flush(self) -> None:
        """Write everything buffered (and admitted meanwhile); return once it is durable.

        Raises:
            Exception: The init failure or the failing batch's error (the batch is kept).
        """
        if not self._pending and self._pump is None and not self._eager:
            # Nothing buffered and no write in flight: everything handed over is durable already.
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = [waiter]
            self._cancel_window()
            self._write_next()
        else:
            self._waiters.append(waiter)
        await waiter

    def _settle_barrier(self, error: BaseException | None) -> None:
        waiters, self._waiters = self._waiters, None
        if waiters is None:
            return
        for waiter in waiters:
            if waiter.done():  # its caller was cancelled
                continue
            if error is None:
                waiter.set_result(None)
            elif isinstance(error, asyncio.CancelledError):
                waiter.cancel()
            else:
                waiter.set_exception(error)

    # ---------------------------------------------------------------- writing

    def _write_next(self) -> None:
        """Start the next batch if one is due and no write is in flight: eagerly when possible."""
        if self._pump is not None or self._eager:
            return  # the write in flight continues with the queue when it settles
        if not self._pending:
            self._settle_barrier(None)
            return
        if not (self._due or self._waiters is not None):
            return
        if self._init is None and self._start_write is not None:
            batch = self._pending
            self._pending = []
            if self._start_write(self, batch, lambda error: self._written(batch, error)):
                self._due = False
                self._eager = True
                return
            self._pending = batch
        self._start_pump()

    def _written(self, batch: list[SessionEvent], error: BaseException | None) -> None:
        """The outcome of an eager write, on the loop: record it, then write on or resolve the flush."""
        self._eager = False
        if error is None:
            self._write_next()
        else:
            self._failed(batch, error)

    def _failed(self, batch: list[SessionEvent], error: BaseException) -> None:
        """Keep a failed batch in front of newer events; fail the barrier, or log a background failure once."""
        self._pending[:0] = batch
        self._cancel_window()
        if self._waiters is not None:
            self._settle_barrier(error)
        else:
            _log.error(
                '%s: background write for session "%s" failed (buffered events retained): %s',
                self._backend_name,
                self.session_id,
                error,
            )

    def _start_pump(self) -> None:
        if self._pump is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._pump = loop.create_task(self._run(), name=f"dsh-persist-{self.session_id}")

    async def _run(self) -> None:
        try:
            await self._run_batches()
        except asyncio.CancelledError as error:
            self._settle_barrier(error)
            raise
        finally:
            self._pump = None

    async def _ensure_init(self) -> bool:
        """Run the init once (as its own task, never abandoned half-way); False when it failed."""
        if self._init_error is None and self._init is not None:
            if self._init_task is None:
                self._init_task = asyncio.ensure_future(self._init(self))
                self._init_task.add_done_callback(retrieve)
            try:
                await asyncio.shield(self._init_task)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self._init_error = error
                self._cancel_window()
                _log.error(
                    '%s: persistence init for session "%s" failed (events stay in memory): %s',
                    self._backend_name,
                    self.session_id,
                    error,
                )
            else:
                self._init = None
        if self._init_error is not None:
            self._settle_barrier(self._init_error)
            return False
        return True

    async def _run_batches(self) -> None:
        while True:
            if not self._pending:
                self._settle_barrier(None)
                return
            if not (self._due or self._waiters is not None):
                return
            if self._init is not None and not await self._ensure_init():
                return
            self._due = False
            batch, self._pending = self._pending, []
            try:
                # Awaited in this task, which nothing else cancels: see the class docs.
                await self._sink(self, batch)
            except asyncio.CancelledError:
                # Only a loop shutdown cancels the pump. Restore the batch so nothing is lost
                # (events a finished write stored are dropped at the next write: seq < cursor).
                self._pending[:0] = batch
                raise
            except Exception as error:
                self._failed(batch, error)
                return
