"""The write path: batching window, flush barrier, init, writer locks, retirement and drain.

Events are written behind the session in batches: a window collects them, `flush` is the barrier
that waits for durability, and a disposed session retires by writing what is left
(docs/architecture.md#write-path, docs/glossary.md#write-behind-window).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from dsh.json import FrozenDict
from dsh.persistence.base import Capability, Fence, Revision
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import LeaseHeldError, PersistenceIOError, SessionAlreadyExistsError
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.events import SessionEvent
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend
from dsh.testing.persistence import eventually
from dsh.testing.stored_logs import MemoryStoredLogWriter, append_closed_turn, append_note, build_records
from dsh.testing.timer import ManualTimer


class LeasingMemory(MemoryBackend):
    """A memory backend that hands out fences, standing in for a leasing (PostgreSQL-like) backend."""

    def __init__(self, storage: MemoryStorage | None = None) -> None:
        super().__init__(storage)
        self.capabilities = frozenset({Capability.TYPED_READS, Capability.LEASES})
        self.fences: list[Fence | None] = []

    async def acquire(self, session_id: str) -> Fence | None:
        """A generation-1 fence held by this test."""
        return Fence(session_id, "test-holder", 1)

    async def append_batch(
        self, header: FrozenDict, events: Sequence[SessionEvent], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Record the fence each append carries."""
        self.fences.append(fence)
        return await super().append_batch(header, events, materialized=materialized, fence=fence)


async def test_event_during_active_write_gets_its_own_window(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend, timer: ManualTimer
) -> None:
    """An event admitted while a background write runs opens a fresh window instead of riding along."""
    session = store.create("s1")
    append_note(session, 0)
    backend.hold_calls("append_batch")
    timer.advance_to(200)
    await backend.wait_calls("append_batch", 1)
    append_note(session, 1)
    assert timer.next_due() == 400
    backend.release_calls("append_batch")
    await backend.wait_appends(1)
    timer.advance_to(399)
    assert backend.calls["append_batch"] == 1
    timer.advance_to(400)
    await backend.wait_appends(2)
    assert [(a.at, a.first_seq, a.count) for a in backend.appends] == [(200, 0, 1), (400, 1, 1)]


async def test_window_expiring_during_a_write_runs_right_after(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend, timer: ManualTimer
) -> None:
    """A batch that falls due while a write is active starts as soon as that write settles."""
    session = store.create("s1")
    append_note(session, 0)
    backend.hold_calls("append_batch")
    timer.advance_to(200)
    await backend.wait_calls("append_batch", 1)
    append_note(session, 1)
    timer.advance_to(400)
    backend.release_calls("append_batch")
    await backend.wait_appends(2)
    assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 1), (1, 1)]


async def test_flush_without_pending_events_writes_nothing(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """A flush with an empty queue returns at once without touching the backend."""
    session = store.create("s1")
    assert await store.flush(session) is True
    assert backend.calls["append_batch"] == 0


async def test_writer_lock_taken_at_first_batch_and_released_at_retirement(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """Without leases the lock is taken when the session materializes and released when it retires."""
    session = store.create("s1")
    assert backend.calls["acquire"] == 0
    append_note(session, 0)
    await store.flush(session)
    append_note(session, 1)
    await store.flush(session)
    assert backend.calls["acquire"] == 1
    assert backend.calls["release"] == 0
    store.dispose(session)
    await coordinator.drain("s1")
    assert backend.calls["release"] == 1


async def test_never_materialized_session_takes_no_lock(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """A session that never appended neither acquires nor releases a writer lock."""
    session = store.create("s1")
    store.dispose(session)
    await coordinator.drain("s1")
    assert backend.calls["acquire"] == 0
    assert backend.calls["release"] == 0


async def test_lease_backend_acquires_at_init_and_fences_appends(store: SessionStore, timer: ManualTimer) -> None:
    """A LEASES backend is acquired at init and every append carries the fence."""
    inner = LeasingMemory()
    backend = FaultyBackend(inner)
    async with PersistenceCoordinator(backend, store, timer=timer):
        session = store.create("s1")
        append_note(session, 0)
        await store.flush(session)
        append_note(session, 1)
        await store.flush(session)
        assert backend.calls["acquire"] == 1
        assert inner.fences == [Fence("s1", "test-holder", 1)] * 2
        store.dispose(session)
    assert backend.calls["release"] == 1


async def test_lock_held_elsewhere_fails_the_write_and_keeps_events(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """SESSION_LEASE_HELD at the first batch fails the flush, keeps events, and a retry succeeds."""
    session = store.create("s1")
    append_closed_turn(session, 1)
    backend.fail_next("acquire", LeaseHeldError("held elsewhere", session_id="s1", holder="1@other"))
    with pytest.raises(LeaseHeldError):
        await store.flush(session)
    assert backend.calls["append_batch"] == 0
    await store.flush(session)
    assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 6)]


async def test_init_failure_is_logged_once_and_reraised(
    coordinator: PersistenceCoordinator,
    store: SessionStore,
    writer: MemoryStoredLogWriter,
    backend: FaultyBackend,
    timer: ManualTimer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed init logs one record, keeps events in memory and is raised by every later flush."""
    caplog.set_level(logging.ERROR)
    await writer.write("s1", {"type": "session", "version": 0, "id": "s1", "createdAt": 1}, [])
    session = store.create("s1")
    append_note(session, 0)
    timer.advance_to(200)
    await eventually(lambda: any("init for session" in r.getMessage() for r in caplog.records))
    append_note(session, 1)
    assert timer.pending == 0
    for _ in range(2):
        with pytest.raises(SessionAlreadyExistsError):
            await store.flush(session)
    assert len([r for r in caplog.records if "init for session" in r.getMessage()]) == 1
    assert backend.calls["exists"] == 1
    assert backend.calls["append_batch"] == 0


async def test_retirement_failure_is_logged_and_retried_by_close(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed retirement logs the pinned line, drain reports it; close() retries and the events land."""
    caplog.set_level(logging.ERROR)
    session = store.create("s1")
    append_closed_turn(session, 1)
    backend.fail_next("append_batch")
    store.dispose(session)
    with pytest.raises(PersistenceIOError):
        await coordinator.drain("s1")
    await eventually(lambda: any('session "s1" retirement failed' in r.getMessage() for r in caplog.records))
    record = next(r for r in caplog.records if "retirement failed" in r.getMessage())
    assert record.getMessage().startswith('memory: session "s1" retirement failed: ')
    await coordinator.close()
    assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 6)]
    assert backend.calls["release"] == 1


async def test_fresh_session_waits_for_retirement_of_same_id(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """A new session with a retiring id waits for the retirement, then finds the id stored."""
    first = store.create("s1")
    append_note(first, 0)
    backend.hold_calls("append_batch")
    store.dispose(first)
    await backend.wait_calls("append_batch", 1)
    second = store.create("s1")
    append_note(second, 0)
    flushing = store.flush(second)
    backend.release_calls("append_batch")
    with pytest.raises(SessionAlreadyExistsError):
        await flushing
    assert [(a.session_id, a.count) for a in backend.appends] == [("s1", 1)]


async def test_drain_waits_for_retirement_and_reports_failures(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """drain() after disposal returns once the events are durable, and raises a write failure."""
    session = store.create("s1")
    append_note(session, 0)
    store.dispose(session)
    await coordinator.drain("s1")
    assert backend.appends[-1].count == 1
    other = store.create("s2")
    append_note(other, 0)
    backend.fail_next("append_batch")
    with pytest.raises(PersistenceIOError):
        await coordinator.drain("s2")
    assert other.state == "live"
    assert len(backend.appends) == 1
    await coordinator.drain("s2")
    assert len(backend.appends) == 2


async def test_background_failure_then_flush_stores_once(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend, timer: ManualTimer
) -> None:
    """After a background failure, an explicit flush retries the retained batch exactly once."""
    session = store.create("s1")
    append_closed_turn(session, 1)
    backend.fail_next("append_batch", PersistenceIOError("disk full"))
    timer.advance_to(200)
    await backend.wait_calls("append_batch", 1)
    await store.flush(session)
    assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 6)]


async def test_resumed_session_writes_only_the_new_suffix(
    coordinator: PersistenceCoordinator, store: SessionStore, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """Attaching a prepared session enqueues end-seed plus pre-publication appends, never the stored log."""
    records = build_records(lambda s: append_closed_turn(s, 1))
    await writer.write("s1", {"type": "session", "version": 0, "id": "s1", "createdAt": 5}, records)
    prepared = await coordinator.prepare("s1")
    append_note(prepared.session, 0)
    session = prepared.publish()
    await store.flush(session)
    assert [(a.first_seq, a.count, a.materialized) for a in backend.appends] == [(6, 2, True)]
    assert backend.calls["acquire"] == 1
    store.dispose(session)
    await coordinator.drain("s1")
    await prepared.close()
    assert backend.calls["release"] == 1
