"""Fixtures for the persistence tests: a manual timer, a memory store and an opened coordinator."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend
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
