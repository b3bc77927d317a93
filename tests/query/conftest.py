"""Fixtures for the session query tests: the store under test, an authoring store and the real stack.

The helpers these fixtures use (transcripts, persistence fakes, spies) live in `tests/query/helpers.py`.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable

import pytest

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend
from dsh.session import SessionStore
from dsh.testing import ManualTimer
from tests.query.helpers import SpyBackend, SpyPersistence, Stack


@pytest.fixture
def store(clock: Callable[[], int], ids: Callable[[], str]) -> SessionStore:
    """The session store the query under test reads."""
    return SessionStore(clock=clock, id_factory=ids)


@pytest.fixture
def author(clock: Callable[[], int]) -> SessionStore:
    """A second store used only to author logs that the query's store never holds live."""
    counter = itertools.count(1)
    return SessionStore(clock=clock, id_factory=lambda: f"x{next(counter):04d}")


@pytest.fixture
async def stack(store: SessionStore) -> AsyncIterator[Stack]:
    """A real `PersistenceCoordinator(MemoryBackend(), store)` with spies; the batching timer never fires."""
    memory = MemoryBackend()
    backend = SpyBackend(memory)
    coordinator = PersistenceCoordinator(backend, store, timer=ManualTimer())  # type: ignore[arg-type]
    async with coordinator:
        yield Stack(store, coordinator, SpyPersistence(coordinator), backend, memory.storage)
