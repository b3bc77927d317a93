"""A full close in the runtime's close order leaves a cache that a new process serves from.

Stack 1 runs sessions over file-backed persistence (JSONL+zstd or SQLite) and a SQLite cache file, then
closes: sessions (disposal writes) → cache → unit registrations → registry → persistence. Stack 2
opens the same files: `cached_snapshot` serves every unit's last value with zero log reads, and a
cold read replays only the one-event anchor. See docs/architecture.md#open-and-close-order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.jsonl import JsonlBackend
from dsh.persistence.sqlite import SqliteBackend
from dsh.projection import ProjectionRegistry, ProjectionSnapshot
from dsh.projection.cache import ProjectionCache
from dsh.projection.cache_storage import SqliteCacheStorage
from dsh.session import HeaderInit, SessionHeader, SessionLogOffset, SessionStore
from dsh.testing.stored_logs import StepClock
from dsh.testing.timer import ManualTimer
from tests.projection.helpers import POLICY, SpyPersistence


@dataclass
class Process:
    """One "process": store, persistence, registry with the units, cache."""

    store: SessionStore
    coordinator: PersistenceCoordinator
    persistence: SpyPersistence
    registry: ProjectionRegistry
    cache: ProjectionCache
    disposers: list

    async def close(self) -> None:
        """The runtime's close order: sessions → cache → unit registrations → registry → persistence."""
        await self.store.aclose()
        await self.cache.aclose()
        for dispose in self.disposers:
            dispose()
        self.registry.close()
        await self.coordinator.close()


def _backend(kind: str, home: Path) -> StorageBackend:
    return JsonlBackend(home / "sessions") if kind == "jsonl" else SqliteBackend(home / "sessions.sqlite3")


async def _start(kind: str, home: Path, units: list, *, start: int) -> Process:
    counter = itertools.count(1)
    store = SessionStore(clock=StepClock(start), id_factory=lambda: f"auto{next(counter)}")
    coordinator = PersistenceCoordinator(_backend(kind, home), store, timer=ManualTimer())
    await coordinator.open()
    persistence = SpyPersistence(coordinator, [])
    registry = ProjectionRegistry(store)
    disposers = [registry.register(spy.unit) for spy in units]
    storage = await SqliteCacheStorage.open(home / "cache.sqlite3")
    cache = await ProjectionCache.open(
        storage, registry=registry, sessions=store, persistence=persistence, config=POLICY, timer=ManualTimer()
    )
    return Process(store, coordinator, persistence, registry, cache, disposers)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_a_new_stack_serves_every_units_last_value_after_a_full_close(
    kind: str, tmp_path: Path, counter, hostonly, nullish, emit
):
    """After the full close order a new stack's `cached_snapshot` serves every unit's final value, zero reads."""
    units = [counter, hostonly, nullish]
    first = await _start(kind, tmp_path, units, start=1_000)
    parent = first.store.create("parent", header=HeaderInit(cwd="/w"))
    emit.turn_start(parent)
    emit.user(parent)
    emit.title(parent, "first title")
    emit.turn_end(parent)
    child = first.store.fork(parent, child_id="child")
    # Events after the last count write: only the disposal write (at close) can cover them.
    emit.user(parent)
    emit.title(parent, "final title")
    emit.user(child)
    expected: dict[str, tuple[SessionHeader, int, ProjectionSnapshot, int]] = {
        s.id: (s.header, s.inherited_event_count, first.registry.snapshot(s), s.seq - 1) for s in (parent, child)
    }
    await first.close()

    second = await _start(kind, tmp_path, units, start=9_000)
    try:
        listed = {row.header.id: row.header for row in await second.persistence.list()}
        assert set(listed) == {"parent", "child"}
        for session_id, (header, cut, live, last_seq) in expected.items():
            assert listed[session_id] == header
            served = await second.cache.cached_snapshot(header, SessionLogOffset(cut))
            assert served is not None, session_id
            assert dict(served.values) == dict(live.values)
            assert served.as_of_seq == last_seq
        assert dict(expected["parent"][2].values) == {"counter": {"n": 2}, "nullish": "final title"}
        assert second.persistence.total_reads == 0

        cold = await second.cache.cold_snapshot(parent.id)
        assert dict(cold.values) == dict(expected["parent"][2].values)
        assert second.persistence.reads_of("parent") == [expected["parent"][3]]  # the one-event anchor only
    finally:
        await second.close()
