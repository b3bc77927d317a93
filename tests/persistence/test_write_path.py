"""The write path's guarantees, proven by counts: fsync before the acknowledgement, no file I/O on the
event loop, writes a cancelled caller cannot interrupt (eager or through the pump), the JSONL writer's
kept descriptor never writing past a changed file, the per-id FIFO locks and the writer threads
(docs/architecture.md#write-path).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dsh.persistence._workers import WriterThreads
from dsh.persistence._writer import KeyedLocks
from dsh.persistence.base import Capability, EagerAppends, Revision, eager_appends_of
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import PersistenceIOError, SessionNotFoundError
from dsh.persistence.jsonl import JsonlBackend
from dsh.persistence.memory import MemoryBackend
from dsh.persistence.postgres import PostgresBackend
from dsh.persistence.sqlite import SqliteBackend
from dsh.session.store import SessionStore
from dsh.testing.faulty import HANG_GUARD_S, FaultyBackend
from dsh.testing.io_faults import io_fault
from dsh.testing.persistence import eventually
from dsh.testing.stored_logs import append_closed_turn, append_note
from dsh.testing.timer import ManualTimer
from tests.persistence.helpers import make_backend, running


class _SyscallLog:
    """Records `os.write` and `os.fsync` calls (and the thread of each) while installed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def note(self, what: str) -> None:
        self.calls.append((what, threading.get_ident()))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> _SyscallLog:
    """Wrap `os.write` and `os.fsync` so a test sees the order and the threads of the durable writes."""
    log = _SyscallLog()
    real_write, real_fsync = os.write, os.fsync

    def write(fd: int, data: bytes) -> int:
        log.note("write")
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        log.note("fsync")
        real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    return log


async def test_each_flush_acknowledges_after_exactly_one_fsync(
    tmp_path: Path, compression: str, syscalls: _SyscallLog
) -> None:
    """Every append + flush of a materialized JSONL session writes once and fsyncs once before it returns."""
    async with running(make_backend(tmp_path / "sessions", compression)) as (_, store):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)  # materialization: temp file, link and directory fsyncs
        syscalls.calls.clear()
        for index in range(1, 6):
            append_note(session, index)
            await store.flush(session)
            syscalls.note("ack")
        assert syscalls.names() == ["write", "fsync", "ack"] * 5


async def test_file_writes_never_run_on_the_event_loop_thread(
    tmp_path: Path, compression: str, syscalls: _SyscallLog
) -> None:
    """Materialization, appends and retirement write and fsync in worker threads, never on the loop's."""
    loop_thread = threading.get_ident()
    async with running(make_backend(tmp_path / "sessions", compression)) as (_, store):
        session = store.create("s1")
        for turn in range(1, 4):
            append_closed_turn(session, turn)
            await store.flush(session)
        append_note(session, 99)
        store.dispose(session)
    assert {"write", "fsync"} <= set(syscalls.names())
    assert [name for name, thread in syscalls.calls if thread == loop_thread] == []


async def test_cancelled_flush_never_interrupts_the_write(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """A flush cancelled mid-write leaves the write to finish and be recorded: the next batch continues it."""
    session = store.create("s1")
    append_note(session, 0)
    append_note(session, 1)
    backend.hold_calls("append_batch")
    flushing = asyncio.ensure_future(store.flush(session))
    await backend.wait_calls("append_batch", 1)
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    backend.release_calls("append_batch")
    await backend.wait_appends(1)
    append_note(session, 2)
    await store.flush(session)
    assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 2), (2, 1)]


async def test_flush_with_nothing_buffered_returns_without_a_write(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """Once everything handed over is durable, another flush costs no backend call."""
    session = store.create("s1")
    append_note(session, 0)
    await store.flush(session)
    for _ in range(3):
        await store.flush(session)
    assert backend.calls["append_batch"] == 1


def _log_path(root: Path) -> Path:
    (path,) = root.rglob("session.jsonl*")
    return path


async def test_log_replaced_behind_the_writer_is_appended_at_its_path(tmp_path: Path, compression: str) -> None:
    """A log swapped for a copy (a new file) is detected: the next batch lands in the file at the path."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, compression)) as (_, store):
        session = store.create("s1")
        append_closed_turn(session, 1)
        await store.flush(session)
        path = _log_path(root)
        copy = tmp_path / "copy"
        shutil.copyfile(path, copy)
        old = path.with_name("old")
        os.link(path, old)  # keep the replaced file reachable to check nothing more reached it
        os.replace(copy, path)
        before = old.stat().st_size
        append_closed_turn(session, 2)
        await store.flush(session)
        assert old.stat().st_size == before
    reader = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    log = await reader.load("s1")
    assert log is not None
    assert [event["seq"] for event in log.events] == list(range(len(session.events)))
    await reader.close()


async def test_log_deleted_behind_the_writer_fails_the_flush_and_keeps_events(tmp_path: Path) -> None:
    """A log removed while its session is live is never written through the old descriptor: the flush fails."""
    root = tmp_path / "sessions"
    store = SessionStore()
    coordinator = PersistenceCoordinator(make_backend(root, "zstd"), store)
    await coordinator.open()
    session = store.create("s1")
    append_note(session, 0)
    await store.flush(session)
    path = _log_path(root)
    path.unlink()
    append_note(session, 1)
    with pytest.raises(SessionNotFoundError):
        await store.flush(session)
    assert not path.exists()
    with pytest.raises(ExceptionGroup) as closing:
        await coordinator.close()  # the retained event still cannot be written
    assert closing.value.exceptions[0].code == "SESSION_NOT_FOUND"  # type: ignore[attr-defined]


async def test_kept_descriptor_is_closed_when_the_session_retires(tmp_path: Path) -> None:
    """The writer's open log lives exactly as long as its writer lock: retirement closes it."""
    backend = make_backend(tmp_path / "sessions", "zstd")
    async with running(backend) as (coordinator, store):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)
        assert len(backend._open_logs) == 1
        store.dispose(session)
        await coordinator.drain("s1")
        assert len(backend._open_logs) == 0


# --------------------------------------------------------------------------------------------------
# Eager appends: the write starts where it falls due and reports back through one callback.


class _CountingJsonl(JsonlBackend):
    """A JSONL backend that counts both append paths and can hold eager appends in the writer thread."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.eager = 0
        self.awaited = 0
        self.entered = 0
        self.gate = threading.Event()
        self.gate.set()

    def start_append(self, *args: Any, **kwargs: Any) -> None:
        self.eager += 1
        super().start_append(*args, **kwargs)

    async def append_batch(self, *args: Any, **kwargs: Any) -> Revision:
        self.awaited += 1
        return await super().append_batch(*args, **kwargs)

    def _append_translated(self, header: Any, events: Any) -> Revision:
        self.entered += 1
        assert self.gate.wait(HANG_GUARD_S)
        return super()._append_translated(header, events)


@contextlib.asynccontextmanager
async def _counting(
    tmp_path: Path, timer: ManualTimer | None = None
) -> AsyncIterator[tuple[_CountingJsonl, SessionStore, PersistenceCoordinator]]:
    backend = _CountingJsonl(tmp_path / "sessions")
    store = SessionStore()
    coordinator = PersistenceCoordinator(backend, store, timer=timer)
    await coordinator.open()
    try:
        yield backend, store, coordinator
    finally:
        backend.gate.set()
        await store.aclose()
        await coordinator.close()


async def _stored_seqs(root: Path) -> list[int]:
    reader = JsonlBackend(root)
    log = await reader.load("s1")
    await reader.close()
    assert log is not None
    return [event["seq"] for event in log.events]


@pytest.mark.parametrize("backend_kind", ["jsonl", "sqlite"])
async def test_flush_of_a_stored_session_starts_no_task_and_one_eager_append(tmp_path: Path, backend_kind: str) -> None:
    """Once a session is stored, each flush hands its batch over directly: no task, no awaited append."""
    backend: Any = (
        _CountingJsonl(tmp_path / "sessions") if backend_kind == "jsonl" else SqliteBackend(tmp_path / "s.sqlite3")
    )
    calls = {"start_append": 0, "append_batch": 0}
    for name in calls:
        method = getattr(backend, name)

        def counted(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(backend, name, counted)
    async with running(backend) as (_, store):
        session = store.create("s1")
        append_closed_turn(session, 1)
        await store.flush(session)  # materializes through append_batch (it takes the writer lock)
        assert calls == {"start_append": 0, "append_batch": 1}
        loop = asyncio.get_running_loop()
        created: list[object] = []
        default = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
            created.append(coro)
            if default is not None:
                return default(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        try:
            for turn in range(2, 5):
                append_closed_turn(session, turn)
                await store.flush(session)
        finally:
            loop.set_task_factory(default)
        assert created == []
        assert calls == {"start_append": 3, "append_batch": 1}


async def test_cancelled_flush_never_interrupts_an_eager_write(tmp_path: Path) -> None:
    """A flush cancelled while its eager write is in the writer thread leaves the write to finish and count."""
    async with _counting(tmp_path) as (backend, store, _):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)
        backend.gate.clear()
        append_note(session, 1)
        flushing = asyncio.ensure_future(store.flush(session))
        await eventually(lambda: backend.entered == 1)
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        append_note(session, 2)
        second = asyncio.ensure_future(store.flush(session))
        await asyncio.sleep(0)
        assert not second.done()  # it waits for the write in flight, then writes event 2
        backend.gate.set()
        await second
        assert backend.eager == 2
    assert await _stored_seqs(tmp_path / "sessions") == [0, 1, 2]


async def test_event_during_an_eager_background_write_gets_its_own_window(tmp_path: Path) -> None:
    """The window's expiry starts the eager write; an event admitted meanwhile opens a fresh window."""
    timer = ManualTimer()
    async with _counting(tmp_path, timer) as (backend, store, coordinator):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)
        backend.gate.clear()
        append_note(session, 1)
        timer.advance_to(200)
        await eventually(lambda: backend.entered == 1)
        append_note(session, 2)
        assert timer.next_due() == 400
        backend.gate.set()
        writer = coordinator._state.live[session]
        await eventually(lambda: writer.cursor == 2)
        timer.advance_to(400)
        await store.flush(session)
        assert backend.eager == 2
    assert await _stored_seqs(tmp_path / "sessions") == [0, 1, 2]


@pytest.mark.parametrize("kind", ["partial-write", "sync"])
async def test_failed_eager_write_raises_keeps_the_batch_and_retries_once(tmp_path: Path, kind: str) -> None:
    """A write failing in the writer thread fails the flush, keeps its events, and the retry stores them once."""
    async with _counting(tmp_path) as (backend, store, _):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)
        append_note(session, 1)
        append_note(session, 2)
        with io_fault(backend, kind, OSError(5, "injected")) as shot, pytest.raises(PersistenceIOError):
            await store.flush(session)
        assert shot.struck
        await store.flush(session)
        assert backend.eager == 2
    assert await _stored_seqs(tmp_path / "sessions") == [0, 1, 2]


async def test_failed_eager_background_write_is_logged_once_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A background eager write that fails is logged once; nothing retries until the next append or flush."""
    timer = ManualTimer()
    async with _counting(tmp_path, timer) as (backend, store, _):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)
        append_note(session, 1)
        with io_fault(backend, "sync", OSError(5, "injected")):
            timer.advance_to(200)
            await eventually(lambda: any("background write" in record.message for record in caplog.records))
        timer.advance_to(10_000)
        assert backend.eager == 1
        assert sum("background write" in record.message for record in caplog.records) == 1
        await store.flush(session)
        assert backend.eager == 2
    assert await _stored_seqs(tmp_path / "sessions") == [0, 1]


# --------------------------------------------------------------------------------------------------
# The per-id locks every backend call of one id runs under


async def test_id_locks_serve_waiters_in_arrival_order() -> None:
    """Callers waiting for one id's lock get it in the order they asked; other ids never wait."""
    locks = KeyedLocks()
    order: list[str] = []

    async def take(name: str) -> None:
        await locks.acquire("s1")
        order.append(name)
        await asyncio.sleep(0)
        locks.release("s1")

    await locks.acquire("s1")
    waiting = [asyncio.ensure_future(take(name)) for name in ("a", "b", "c")]
    await asyncio.sleep(0)
    await locks.acquire("s2")  # another id: no wait
    locks.release("s2")
    locks.release("s1")
    await asyncio.gather(*waiting)
    assert order == ["a", "b", "c"]
    assert len(locks) == 0


async def test_cancelled_lock_waiter_passes_the_lock_on() -> None:
    """A waiter cancelled in the queue, even one the lock was just handed to, never strands the lock."""
    locks = KeyedLocks()
    await locks.acquire("s1")
    first = asyncio.ensure_future(locks.acquire("s1"))
    second = asyncio.ensure_future(locks.acquire("s1"))
    await asyncio.sleep(0)
    locks.release("s1")  # handed to `first` ...
    first.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    locks.release("s1")
    assert len(locks) == 0


async def test_try_acquire_takes_only_a_free_lock() -> None:
    """`try_acquire` succeeds on a free id and refuses, changing nothing, while it is held or awaited."""
    locks = KeyedLocks()
    assert locks.try_acquire("s1")
    assert not locks.try_acquire("s1")
    waiter = asyncio.ensure_future(locks.acquire("s1"))
    await asyncio.sleep(0)
    locks.release("s1")
    assert not locks.try_acquire("s1")  # handed to the waiter, which has not run yet
    await waiter
    locks.release("s1")
    assert locks.try_acquire("s1")
    locks.release("s1")
    assert len(locks) == 0


@pytest.mark.parametrize("name", ["memory", "jsonl", "sqlite", "postgresql"])
def test_eager_appends_are_declared_exactly_when_implemented(tmp_path: Path, name: str) -> None:
    """A shipped backend declares EAGER_APPENDS if and only if it implements `EagerAppends` (JSONL, SQLite)."""
    backend: Any = {
        "memory": MemoryBackend,
        "jsonl": lambda: JsonlBackend(tmp_path / "sessions"),
        "sqlite": lambda: SqliteBackend(tmp_path / "s.sqlite3"),
        "postgresql": lambda: PostgresBackend("postgresql://127.0.0.1/never-opened"),
    }[name]()
    declared = Capability.EAGER_APPENDS in backend.capabilities
    assert declared == isinstance(backend, EagerAppends) == (name in ("jsonl", "sqlite"))
    assert (eager_appends_of(backend) is backend) == declared


def test_the_fault_wrapper_is_written_through_append_batch(tmp_path: Path) -> None:
    """`FaultyBackend` forwards no eager appends, so every write through it is an awaited, counted call."""
    wrapped = FaultyBackend(JsonlBackend(tmp_path / "sessions"))
    assert eager_appends_of(wrapped) is None


# --------------------------------------------------------------------------------------------------
# The writer threads behind eager appends


async def test_writer_threads_run_one_keys_jobs_in_order_on_one_thread() -> None:
    """Jobs of one key run in submission order on one thread and report each outcome on the loop."""
    threads = WriterThreads("test-writer", 3)
    loop = asyncio.get_running_loop()
    ran: list[tuple[int, int]] = []
    outcomes: list[BaseException | None] = []
    finished = asyncio.Event()

    def job(index: int) -> None:
        ran.append((index, threading.get_ident()))
        if index == 2:
            raise OSError(5, "injected")

    def done(error: BaseException | None) -> None:
        assert threading.get_ident() == loop_thread
        outcomes.append(error)
        if len(outcomes) == 4:
            finished.set()

    loop_thread = threading.get_ident()
    for index in range(4):
        threads.submit("s1", job, (index,), loop, done)
    await asyncio.wait_for(finished.wait(), HANG_GUARD_S)
    assert [index for index, _ in ran] == [0, 1, 2, 3]
    assert len({thread for _, thread in ran}) == 1
    assert [type(error) for error in outcomes] == [type(None), type(None), OSError, type(None)]
    await asyncio.to_thread(threads.close)
    with pytest.raises(RuntimeError):
        threads.submit("s1", job, (5,), loop, done)
