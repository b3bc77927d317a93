"""Fixtures for the projection tests: a store, a registry, spied units, event helpers and the cache stack.

`counter` counts `user/message` events (view `{"n": int}`), `hostonly` counts every event (no view),
`nullish` shows `null` until a `session/title` event, `bomb` raises on an event whose data is
`{"boom": True}`. Each is a `Spy`: the unit plus counters of `apply` and `render` calls. `stack` is
the cache stack over the storage `storage_kind` names (memory, SQLite or PostgreSQL). The helpers these are built
from live in `tests/projection/helpers.py`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from dsh.json import JsonValue
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.projection import ProjectionRegistry
from dsh.projection.cache import ProjectionCache, ProjectionCacheConfig
from dsh.session import Session, SessionStore
from dsh.testing.timer import ManualTimer
from tests.projection.helpers import (
    POLICY,
    STORAGE_KINDS,
    CacheStack,
    Emit,
    Kit,
    Spy,
    SpyPersistence,
    SpyStorage,
    bomb_unit,
    counting_unit,
    nullish_unit,
    open_storage,
)


@pytest.fixture
def store(clock: Callable[[], int], ids: Callable[[], str]) -> SessionStore:
    """A session store with a deterministic clock and ids."""
    return SessionStore(clock=clock, id_factory=ids)


@pytest.fixture
def registry(store: SessionStore) -> Iterator[ProjectionRegistry]:
    """A registry driven by `store`, closed after the test."""
    reg = ProjectionRegistry(store)
    yield reg
    reg.close()


@pytest.fixture
def emit() -> Emit:
    """Event helpers."""
    return Emit()


@pytest.fixture
def counter() -> Spy:
    """Client-visible unit counting `user/message` events (view `{"n": int}`)."""
    return counting_unit()


@pytest.fixture
def hostonly() -> Spy:
    """Host-only unit counting every event."""
    return counting_unit("hostonly", counts=None, visible=False)


@pytest.fixture
def nullish() -> Spy:
    """Unit whose view is `null` until a `session/title` event."""
    return nullish_unit()


@pytest.fixture
def bomb() -> Spy:
    """Client-visible unit whose `apply` raises on an event with data `{"boom": True}`."""
    return bomb_unit()


@pytest.fixture
def changes(registry: ProjectionRegistry) -> list[tuple[Session, str, JsonValue, int]]:
    """Every `(session, key, value, seq)` the registry pushes."""
    seen: list[tuple[Session, str, JsonValue, int]] = []
    registry.on_changed(lambda s, k, v, q: seen.append((s, k, v, q)))
    return seen


@pytest.fixture
def kit() -> Kit:
    """Unit factories, the event kinds of random logs, and the schemas the fixtures use."""
    return Kit()


@pytest.fixture(params=STORAGE_KINDS)
def storage_kind(request: pytest.FixtureRequest) -> str:
    """Which cache storage the stack uses: memory, SQLite or PostgreSQL."""
    return str(request.param)


@pytest.fixture
def policy() -> ProjectionCacheConfig:
    """The stack's write policy (`POLICY`); a test parametrizes `policy` to use another one."""
    return POLICY


@pytest_asyncio.fixture
async def stack(
    storage_kind: str, store: SessionStore, registry: ProjectionRegistry, tmp_path: Path, policy: ProjectionCacheConfig
) -> AsyncIterator[CacheStack]:
    """The cache stack over the chosen storage, closed in the runtime's close order at teardown."""
    order: list[str] = []
    memory = MemoryStorage()
    coordinator = PersistenceCoordinator(MemoryBackend(memory), store, timer=ManualTimer())
    await coordinator.open()
    spy = SpyPersistence(coordinator, order)
    storage = SpyStorage(await open_storage(storage_kind, tmp_path / "cache" / "cache.sqlite3"), order)
    timer = ManualTimer()
    cache = await ProjectionCache.open(
        storage, registry=registry, sessions=store, persistence=spy, config=policy, timer=timer
    )
    built = CacheStack(storage_kind, store, registry, memory, coordinator, spy, storage, cache, timer, order)
    try:
        yield built
    finally:
        storage.release_all()
        with contextlib.suppress(Exception):
            await built.close()
