"""`FaultyBackend` and in-backend faults on the memory backend: batches stay all-or-nothing.

A batch that fails part-way (a torn write, a failed sync, a failed rollback) must leave the stored
log and its revision exactly as they were, so the retry stores every event once
(docs/storage-format.md#durability).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from dsh.json import FrozenDict
from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import AppendConflictError, PersistenceIOError, SessionAlreadyExistsError
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.events import SessionEvent
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend
from dsh.testing.io_faults import IOFaultKind, IOFaultShot, io_fault, io_fault_injector
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


def test_the_memory_backend_has_an_in_backend_fault_injector() -> None:
    """`dsh.testing.io_faults` knows how to fail the memory backend's writes, so the wrapper can arm them."""
    assert io_fault_injector(MemoryBackend()) is not None
    assert FaultyBackend(MemoryBackend()).has_io_faults


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


async def test_partial_fault_needs_an_injector(storage: MemoryStorage) -> None:
    """Asking for an in-backend fault over a backend without an injector is a TypeError."""

    class Plain:
        name = "plain"
        capabilities = frozenset()

    faulty = FaultyBackend(Plain())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        faulty.fail_next_append(partial=True)


async def test_an_io_fault_strikes_once_inside_its_block(storage: MemoryStorage) -> None:
    """`io_fault` fails the first write in its block only (rolled back); later writes and writes after it go through."""
    inner, _ = await opened(storage)
    events = events_of(6)
    await inner.append_batch(HEADER, events[:2], materialized=False, fence=None)
    with io_fault(inner, "sync") as shot:
        assert not shot.struck
        with pytest.raises(PersistenceIOError, match="injected sync fault"):
            await inner.append_batch(HEADER, events[2:4], materialized=True, fence=None)
        assert shot.struck
        assert await stored_count(inner) == 2
        await inner.append_batch(HEADER, events[2:4], materialized=True, fence=None)
    await inner.append_batch(HEADER, events[4:], materialized=True, fence=None)
    assert await stored_count(inner) == 6


async def test_an_io_fault_left_unreached_changes_nothing_after_its_block(storage: MemoryStorage) -> None:
    """A fault whose block saw no write is gone when the block ends: the next write stores its batch."""
    inner, _ = await opened(storage)
    with io_fault(inner, "partial-write") as shot:
        pass
    await inner.append_batch(HEADER, events_of(2), materialized=False, fence=None)
    assert not shot.struck
    assert await stored_count(inner) == 2


def test_io_fault_refuses_an_unknown_kind_or_backend() -> None:
    """An unknown kind is a ValueError; a backend with no injector (and none given) is a TypeError."""
    with pytest.raises(ValueError, match="unknown in-backend fault kind"), io_fault(MemoryBackend(), "torn"):  # type: ignore[arg-type]
        pass
    with pytest.raises(TypeError, match="no in-backend fault injector"), io_fault(object(), "sync"):
        pass


async def test_an_armed_fault_is_used_by_the_next_forwarded_write_only(storage: MemoryStorage) -> None:
    """The wrapper installs its armed fault for one forwarded write: a refused write uses it up; `clear` drops it."""
    inner, faulty = await opened(storage)
    events = events_of(4)
    await faulty.append_batch(HEADER, events[:2], materialized=False, fence=None)
    faulty.fail_next_sync()
    with pytest.raises(AppendConflictError):
        await faulty.append_batch(HEADER, events[3:], materialized=True, fence=None)
    await faulty.append_batch(HEADER, events[2:3], materialized=True, fence=None)
    faulty.fail_next_sync()
    faulty.clear()
    await faulty.append_batch(HEADER, events[3:], materialized=True, fence=None)
    assert await stored_count(inner) == 4


async def test_a_backend_of_ones_own_brings_its_injector(storage: MemoryStorage) -> None:
    """`FaultyBackend(..., io_faults=inject)` arms in-backend faults through that injector, for one write."""
    entered: list[IOFaultKind] = []

    @contextlib.contextmanager
    def inject(backend: MemoryBackend, shot: IOFaultShot) -> Iterator[None]:
        entered.append(shot.fault.kind)
        with io_fault_injector(backend)(backend, shot):  # type: ignore[misc]
            yield

    inner = MemoryBackend(storage)
    faulty = FaultyBackend(inner, io_faults=inject)
    events = events_of(4)
    faulty.fail_next_rollback()
    with pytest.raises(PersistenceIOError):
        await faulty.append_batch(HEADER, events[:2], materialized=False, fence=None)
    await faulty.append_batch(HEADER, events[:2], materialized=False, fence=None)
    assert entered == ["rollback"]
    assert await stored_count(inner) == 2


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
