"""Fixtures of the persistence tests (plain helpers live in `tests/persistence/helpers.py`).

A manual timer, a memory backend wrapped for fault injection, a store and an opened coordinator over
them, each JSONL encoding in turn, and a strict guard against `sqlite3` calls on the event loop.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend
from dsh.testing.sqlite_writer import SqliteLoopGuard
from dsh.testing.stored_logs import MemoryStoredLogWriter, StepClock
from dsh.testing.timer import ManualTimer


@pytest.fixture
def timer() -> ManualTimer:
    """A manual timer; time moves only when a test advances it."""
    return ManualTimer()


@pytest.fixture
def storage() -> MemoryStorage:
    """A fresh memory storage."""
    return MemoryStorage()


@pytest.fixture
def writer(storage: MemoryStorage) -> MemoryStoredLogWriter:
    """The fixture writer of `storage`."""
    return MemoryStoredLogWriter(storage)


@pytest.fixture
def backend(storage: MemoryStorage, timer: ManualTimer) -> FaultyBackend:
    """A counting, fault-injecting wrapper around a memory backend over `storage`."""
    return FaultyBackend(MemoryBackend(storage), clock=lambda: timer.now_ms)


@pytest.fixture
def store() -> SessionStore:
    """A session store with a deterministic clock and ids."""
    counter = itertools.count(1)
    return SessionStore(clock=StepClock(), id_factory=lambda: f"auto{next(counter):04d}")


@pytest_asyncio.fixture
async def coordinator(
    backend: FaultyBackend, store: SessionStore, timer: ManualTimer
) -> AsyncIterator[PersistenceCoordinator]:
    """An opened coordinator over `backend` and `store`; store and coordinator close at teardown."""
    coordinator = PersistenceCoordinator(backend, store, timer=timer)
    await coordinator.open()
    try:
        yield coordinator
    finally:
        backend.clear()
        for method in list(backend.calls):
            backend.release_calls(method)
        with contextlib.suppress(Exception):
            await store.aclose()
        with contextlib.suppress(Exception):
            await coordinator.close()


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    """Each JSONL encoding in turn: zstd frames and plain `.jsonl` lines."""
    return str(request.param)


@pytest.fixture
def strict_sqlite_guard() -> Iterator[None]:
    """Fail the test if any `sqlite3` call ran on the event loop, including calls made by the test itself.

    The suite-wide guard counts only library code; the SQLite tests also hold their own raw
    connections and fixture writers to the rule (docs/architecture.md#threads-and-the-event-loop).
    """
    with SqliteLoopGuard() as guard:
        yield
    guard.assert_clean()
