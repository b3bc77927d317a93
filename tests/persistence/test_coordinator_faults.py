"""`FaultyBackend` and the memory backend's in-backend faults: batches stay all-or-nothing.

A batch that fails part-way (a torn write, a failed sync, a failed rollback) must leave the stored
log and its revision exactly as they were, so the retry stores every event once
(docs/storage-format.md#durability).
"""

from __future__ import annotations

import asyncio

import pytest

from dsh.json import FrozenDict
from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import AppendConflictError, PersistenceIOError, SessionAlreadyExistsError
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.events import SessionEvent
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend, IOFaultSeam
from dsh.testing.stored_logs import append_closed_turn, append_note, build_records


def events_of(count: int) -> list[SessionEvent]:
    """`count` frozen note events with seqs 0..count-1."""

    def build(session: object) -> None:
        for index in range(count):
            append_note(session, index)  # type: ignore[arg-type]

    return [SessionEvent(FrozenDict(record)) for record in build_records(build)]


HEADER = FrozenDict({"type": "session", "version": 0, "id": "s1", "createdAt": 1, "delegationDepth": 0})


async def opened(storage: MemoryStorage) -> tuple[MemoryBackend, FaultyBackend]:
    """A memory backend over `storage` and its faulty wrapper, opened."""
    inner = MemoryBackend(storage)
    faulty = FaultyBackend(inner)
    await faulty.open()
    return inner, faulty


async def stored_count(backend: StorageBackend) -> int:
    """How many events the backend stores for s1."""
    log = await backend.load("s1")
    return 0 if log is None else len(log.events)


def test_memory_backend_offers_the_fault_seam() -> None:
    """The memory backend implements IOFaultSeam, so partial and sync faults work on it."""
    assert isinstance(MemoryBackend(), IOFaultSeam)


@pytest.mark.parametrize("arm", ["partial", "sync", "rollback"])
async def test_in_backend_faults_leave_nothing_written(storage: MemoryStorage, arm: str) -> None:
    """A partial-write, sync or rollback fault raises and leaves the stored log and revision unchanged."""
    inner, faulty = await opened(storage)
    events = events_of(6)
    await faulty.append_batch(HEADER, events[:2], materialized=False, fence=None)
    before = await faulty.read_revision("s1")
    if arm == "partial":
        faulty.fail_next_append(partial=True)
    elif arm == "sync":
        faulty.fail_next_sync()
    else:
        faulty.fail_next_rollback()
    with pytest.raises(PersistenceIOError):
        await faulty.append_batch(HEADER, events[2:], materialized=True, fence=None)
    assert await stored_count(inner) == 2
    assert await faulty.read_revision("s1") == before
    await faulty.append_batch(HEADER, events[2:], materialized=True, fence=None)
    assert await stored_count(inner) == 6


async def test_partial_fault_needs_a_seam(storage: MemoryStorage) -> None:
    """Asking a backend without IOFaultSeam for an in-backend fault is a TypeError."""

    class Plain:
        name = "plain"
        capabilities = frozenset()

    faulty = FaultyBackend(Plain())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        faulty.fail_next_append(partial=True)


async def test_fail_after_events_refuses_the_crossing_batch_once(storage: MemoryStorage) -> None:
    """fail_after_events(k) lets k events through; the batch crossing k fails once, unwritten."""
    inner, faulty = await opened(storage)
    events = events_of(6)
    faulty.fail_after_events(3)
    await faulty.append_batch(HEADER, events[:2], materialized=False, fence=None)
    with pytest.raises(PersistenceIOError):
        await faulty.append_batch(HEADER, events[2:4], materialized=True, fence=None)
    assert await stored_count(inner) == 2
    await faulty.append_batch(HEADER, events[2:4], materialized=True, fence=None)
    assert await stored_count(inner) == 4
    assert faulty.calls["append_batch"] == 3
    assert [(a.first_seq, a.count) for a in faulty.appends] == [(0, 2), (2, 2)]


async def test_memory_append_rules(storage: MemoryStorage) -> None:
    """Materializing twice is SESSION_ALREADY_EXISTS; a stale or gapped batch is APPEND_SEQ_MISMATCH."""
    inner, _ = await opened(storage)
    events = events_of(4)
    await inner.append_batch(HEADER, events[:2], materialized=False, fence=None)
    with pytest.raises(SessionAlreadyExistsError):
        await inner.append_batch(HEADER, events[:2], materialized=False, fence=None)
    with pytest.raises(AppendConflictError):
        await inner.append_batch(HEADER, [events[3]], materialized=True, fence=None)
    with pytest.raises(AppendConflictError):
        await inner.append_batch(HEADER, [events[2], events[2]], materialized=True, fence=None)
    assert await stored_count(inner) == 2


async def test_memory_revisions_name_store_incarnation_and_counter(storage: MemoryStorage) -> None:
    """Memory revisions read mem:<store uuid>:<incarnation>:<n> and differ between stores."""
    inner, _ = await opened(storage)
    revision = await inner.append_batch(HEADER, events_of(1), materialized=False, fence=None)
    prefix, store_id, incarnation, counter = revision.split(":")
    assert (prefix, store_id) == ("mem", storage.store_id)
    assert incarnation
    assert counter.isdigit()
    other = MemoryBackend()
    assert await other.append_batch(HEADER, events_of(1), materialized=False, fence=None) != revision


async def test_closed_memory_backend_refuses_calls(storage: MemoryStorage) -> None:
    """A closed memory backend raises PERSISTENCE_CLOSED while its storage stays readable to others."""
    inner, _ = await opened(storage)
    await inner.append_batch(HEADER, events_of(1), materialized=False, fence=None)
    await inner.close()
    with pytest.raises(Exception, match="closed"):
        await inner.load("s1")
    assert await stored_count(MemoryBackend(storage)) == 1


async def test_gates_hold_calls_until_released(store: SessionStore, storage: MemoryStorage) -> None:
    """A gated method waits after being counted; wait_calls observes it; releasing lets it finish."""
    _, faulty = await opened(storage)
    async with PersistenceCoordinator(faulty, store) as coordinator:
        session = store.create("s1")
        append_closed_turn(session, 1)
        faulty.hold_calls("append_batch")
        task = asyncio.ensure_future(store.flush(session))
        await faulty.wait_calls("append_batch", 1)
        assert not task.done()
        faulty.release_calls("append_batch")
        await task
        assert await coordinator.revision("s1") is not None
