"""Fixtures and spies for the projection-cache tests (03 §3, §5 #26-#45).

The "cache stack" is the projection `store` and `registry` fixtures plus memory persistence (a
`PersistenceCoordinator` over a `MemoryBackend`), seen by the cache through a `SpyPersistence`, and a
`ProjectionCache` (count throttle 3, interval 250 ms, a `ManualTimer`) over a `SpyStorage` that wraps
either a `MemoryCacheStorage` or a `SqliteCacheStorage` file in `tmp_path`. Test modules import the
fixtures they use from here (`stack_fixture`, `storage_kind_fixture`; the fixture names are `stack`
and `storage_kind`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from dsh.abort import AbortSignal
from dsh.persistence.base import EventSlice, PersistenceObservation, PreparedSession
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.projection import ProjectionRegistry
from dsh.projection.cache import ProjectionCache, ProjectionCacheConfig
from dsh.projection.cache_storage import (
    CacheIdentity,
    CacheRecord,
    CacheStorage,
    MemoryCacheStorage,
    SqliteCacheStorage,
)
from dsh.projection.unit import CheckpointRow
from dsh.session import Session, SessionStore
from dsh.session.header import SessionId
from dsh.testing.counting import CountingPersistence
from dsh.testing.stored_logs import BASE_TIME_MS, MemoryStoredLogWriter, build_records, write_stored_log
from dsh.testing.timer import ManualTimer

STORAGE_KINDS = ("memory", "sqlite")
HANG_GUARD_S = 10.0
"""Generous timeout that only guards against hangs; never a timing assertion."""

POLICY = ProjectionCacheConfig(write_every_events=3, write_interval_ms=250, close_timeout_s=5.0)


async def until(predicate: Callable[[], bool], condition: asyncio.Condition | None = None) -> None:
    """Wait until `predicate()` holds: on `condition` when given, else by yielding to the loop."""

    async def wait() -> None:
        if condition is not None:
            async with condition:
                await condition.wait_for(predicate)
            return
        while not predicate():
            await asyncio.sleep(0)

    await asyncio.wait_for(wait(), HANG_GUARD_S)


class SpyStorage:
    """A `CacheStorage` wrapper that records calls, injects failures and can hold `put` calls.

    Attributes:
        inner: The wrapped storage.
        calls: `("get" | "put" | "delete", session_id)` in call order.
        order: A shared list the test may also append to (flush and drain markers); `put` appends
            `"put"` when it starts.
        fail_puts / fail_gets: Exceptions raised by the next calls (consumed in order).
        in_flight / max_in_flight: Puts currently inside the wrapped storage, and the peak.
    """

    def __init__(self, inner: CacheStorage, order: list[str]) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.order = order
        self.fail_puts: list[Exception] = []
        self.fail_gets: list[Exception] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.changed = asyncio.Condition()
        self._held = False
        self._gates: list[asyncio.Event] = []
        self.on_put: Callable[[str, CacheRecord], None] | None = None

    @property
    def puts(self) -> int:
        """How many `put` calls completed or failed."""
        return sum(1 for call in self.calls if call[0] == "put")

    @property
    def gets(self) -> int:
        """How many `get` calls were made."""
        return sum(1 for call in self.calls if call[0] == "get")

    def hold_puts(self) -> None:
        """Make later `put` calls wait until released."""
        self._held = True

    def release_one(self) -> None:
        """Let the oldest held `put` proceed."""
        self._gates.pop(0).set()

    def release_all(self) -> None:
        """Stop holding and let every held `put` proceed."""
        self._held = False
        for gate in self._gates:
            gate.set()
        self._gates.clear()

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def get(self, session_id: SessionId) -> CacheRecord | None:
        """Record, maybe fail, delegate."""
        self.calls.append(("get", session_id))
        if self.fail_gets:
            raise self.fail_gets.pop(0)
        return await self.inner.get(session_id)

    async def put(self, session_id: SessionId, record: CacheRecord) -> None:
        """Record, maybe hold or fail, delegate."""
        self.order.append("put")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self._held:
                gate = asyncio.Event()
                self._gates.append(gate)
                await self._notify()
                await gate.wait()
            if self.fail_puts:
                raise self.fail_puts.pop(0)
            if self.on_put is not None:
                self.on_put(session_id, record)
            await self.inner.put(session_id, record)
        finally:
            self.in_flight -= 1
            self.calls.append(("put", session_id))
            await self._notify()

    async def delete(self, session_id: SessionId) -> None:
        """Record and delegate."""
        self.calls.append(("delete", session_id))
        await self.inner.delete(session_id)

    async def aclose(self) -> None:
        """Delegate."""
        await self.inner.aclose()

    async def wait_puts(self, count: int) -> None:
        """Wait until `count` puts finished (guarded against hangs)."""
        await until(lambda: self.puts >= count, self.changed)

    async def wait_held(self, count: int) -> None:
        """Wait until `count` puts are held."""
        await until(lambda: len(self._gates) >= count, self.changed)


class SpyPersistence(CountingPersistence):
    """A `CountingPersistence` that also records each call with its `from_seq`, in order.

    Attributes:
        calls: `("read_events", id, from_seq)`, `("inspect", id, None)`, `("drain", id, None)`.
        order: The shared order list (`"drain-start"`, `"drain-end"`).
        after_read: Called after each `read_events` returned (tests abort a signal there).
        read_error: Raised by every `read_events` instead of reading.
        read_gate: When set, `read_events` waits for it before reading (`reading` is set on entry).
    """

    def __init__(self, inner: PersistenceCoordinator, order: list[str]) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, str, int | None]] = []
        self.order = order
        self.after_read: Callable[[int], None] | None = None
        self.read_error: Exception | None = None
        self.read_gate: asyncio.Event | None = None
        self.reading = asyncio.Event()

    def reads_of(self, session_id: str) -> list[int]:
        """The `from_seq` of every `read_events` of `session_id`."""
        return [seq for kind, sid, seq in self.calls if kind == "read_events" and sid == session_id and seq is not None]

    async def read_events(
        self,
        session_id: str,
        *,
        types: Collection[str] | None = None,
        from_seq: int = 0,
        signal: AbortSignal | None = None,
    ) -> EventSlice:
        """Record and delegate."""
        self.calls.append(("read_events", session_id, from_seq))
        self.reading.set()
        if self.read_gate is not None:
            await self.read_gate.wait()
        if self.read_error is not None:
            raise self.read_error
        result = await super().read_events(session_id, types=types, from_seq=from_seq, signal=signal)
        if self.after_read is not None:
            self.after_read(from_seq)
        return result

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """Record and delegate."""
        self.calls.append(("inspect", session_id, None))
        return await super().inspect(session_id, signal=signal)

    async def prepare(self, session_id: str, *, signal: AbortSignal | None = None) -> PreparedSession:
        """Record and delegate."""
        self.calls.append(("prepare", session_id, None))
        return await super().prepare(session_id, signal=signal)

    async def drain(self, session_id: str) -> None:
        """Record and delegate."""
        self.calls.append(("drain", session_id, None))
        self.order.append("drain-start")
        await super().drain(session_id)
        self.order.append("drain-end")


@dataclass
class CacheStack:
    """Store + memory persistence + registry + cache, with their spies."""

    kind: str
    store: SessionStore
    registry: ProjectionRegistry
    memory: MemoryStorage
    coordinator: PersistenceCoordinator
    persistence: SpyPersistence
    storage: SpyStorage
    cache: ProjectionCache
    timer: ManualTimer
    order: list[str]
    disposers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def writer(self) -> MemoryStoredLogWriter:
        """Writes stored logs straight into the memory persistence."""
        return MemoryStoredLogWriter(self.memory)

    def register(self, *units: Any) -> None:
        """Register spied units (`Spy` fixtures) or plain units."""
        for unit in units:
            self.disposers.append(self.registry.register(getattr(unit, "unit", unit)))

    async def settle(self) -> None:
        """Wait until no policy write of the cache is in flight (guarded against hangs)."""

        async def drained() -> None:
            while self.cache._tasks:
                await asyncio.gather(*list(self.cache._tasks), return_exceptions=True)

        await asyncio.wait_for(drained(), HANG_GUARD_S)

    async def record(self, session_id: str) -> CacheRecord | None:
        """The stored record, read past the spy (so it does not count as a cache read)."""
        return await self.storage.inner.get(SessionId(session_id))

    async def store_log(
        self, session_id: str, build: Callable[[Session], object], **header: Any
    ) -> list[dict[str, Any]]:
        """Store a valid log for `session_id` built by `build`; returns its raw records."""
        records = build_records(build, session_id=session_id)
        await write_stored_log(self.writer, session_id, records, **header)
        return records

    async def put_rows(
        self,
        session_id: str,
        rows: dict[str, CheckpointRow],
        *,
        created_at: int = BASE_TIME_MS,
        cwd: str | None = None,
        cut: int = 0,
    ) -> None:
        """Store a record past the spy."""
        await self.storage.inner.put(SessionId(session_id), CacheRecord(CacheIdentity(created_at, cwd, cut), rows))

    async def put_raw(self, session_id: str, text: str, *, created_at: int = BASE_TIME_MS) -> None:
        """Store arbitrary rows text (a poisoned record)."""
        inner = self.storage.inner
        assert isinstance(inner, MemoryCacheStorage | SqliteCacheStorage)
        await inner.put_raw(session_id, CacheIdentity(created_at, None, 0), text)

    async def close(self) -> None:
        """Close in the 00 §3 order: sessions, cache, unit registrations, registry, persistence."""
        await self.store.aclose()
        await self.cache.aclose()
        for dispose in self.disposers:
            dispose()
        self.registry.close()
        await self.coordinator.close()


async def open_storage(kind: str, path: Path) -> CacheStorage:
    """A fresh memory storage, or a SQLite storage at `path`."""
    if kind == "memory":
        return MemoryCacheStorage()
    return await SqliteCacheStorage.open(path)


@pytest.fixture(name="storage_kind", params=STORAGE_KINDS)
def storage_kind_fixture(request: pytest.FixtureRequest) -> str:
    """Which cache storage the stack uses: memory or SQLite."""
    return str(request.param)


@pytest_asyncio.fixture(name="stack")
async def stack_fixture(
    storage_kind: str, store: SessionStore, registry: ProjectionRegistry, tmp_path: Path
) -> AsyncIterator[CacheStack]:
    """The cache stack over the chosen storage; closed in the 00 §3 order at teardown."""
    order: list[str] = []
    memory = MemoryStorage()
    coordinator = PersistenceCoordinator(MemoryBackend(memory), store, timer=ManualTimer())
    await coordinator.open()
    spy = SpyPersistence(coordinator, order)
    storage = SpyStorage(await open_storage(storage_kind, tmp_path / "cache" / "cache.sqlite3"), order)
    timer = ManualTimer()
    cache = await ProjectionCache.open(
        storage, registry=registry, sessions=store, persistence=spy, config=POLICY, timer=timer
    )
    built = CacheStack(storage_kind, store, registry, memory, coordinator, spy, storage, cache, timer, order)
    try:
        yield built
    finally:
        storage.release_all()
        with contextlib.suppress(Exception):
            await built.close()
