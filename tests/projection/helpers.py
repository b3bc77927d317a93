"""Shared helpers for the projection tests: spied units, event emitters and the cache stack.

The units: `counting_unit` counts events of one type (or every event) with view `{"n": int}`,
`nullish_unit` shows `null` until a `session/title` event, `bomb_unit` raises on an event whose
data is `{"boom": True}`. Each comes wrapped in a `Spy` that counts the registry's `apply` and
`render` calls. `Emit` appends valid events of the kinds these tests use.

The cache stack (`CacheStack`) is a store and registry plus memory persistence (a
`PersistenceCoordinator` over a `MemoryBackend`) that the cache sees through a `SpyPersistence`,
and a `ProjectionCache` (count throttle 3, interval 250 ms, a `ManualTimer`) over a `SpyStorage`
that wraps a `MemoryCacheStorage`, a `SqliteCacheStorage` file or a `PostgresCacheStorage` in a
throw-away schema (`DSH_TEST_POSTGRES_URL`). The fixtures that build
these live in `conftest.py`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from dsh.abort import AbortSignal
from dsh.persistence.base import EventSlice, PersistenceObservation, PreparedSession
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryStorage
from dsh.persistence.postgres import PostgresBackend
from dsh.projection import ClientView, ProjectionRegistry, ProjectionUnit
from dsh.projection.cache import ProjectionCache, ProjectionCacheConfig
from dsh.projection.cache_postgres import PostgresCacheStorage
from dsh.projection.cache_storage import (
    CacheIdentity,
    CacheRecord,
    CacheStorage,
    MemoryCacheStorage,
    SqliteCacheStorage,
)
from dsh.projection.unit import CheckpointRow
from dsh.session import Session, SessionEvent, SessionStore
from dsh.session.header import SessionId
from dsh.session.stored import StoredEvents
from dsh.testing.counting import CountingPersistence
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.stored_logs import BASE_TIME_MS, MemoryStoredLogWriter, build_records, write_stored_log
from dsh.testing.timer import ManualTimer

# --------------------------------------------------------------------------------------------------
# Spied units


class Count(TypedDict):
    """State and view of the counting units."""

    n: int


class Title(TypedDict, total=False):
    """State of the `nullish` unit: `{}` until a title is known."""

    title: str


COUNT = TypeAdapter(Count)
TITLE = TypeAdapter(Title)
MAYBE_STR: TypeAdapter[str | None] = TypeAdapter(str | None)
ANY_VIEW: TypeAdapter[Any] = TypeAdapter(Any)
OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


@dataclass
class Spy:
    """A unit and the number of times the registry called its `apply` and `render`."""

    unit: ProjectionUnit[Any, Any] = field(init=False)
    applies: int = 0
    renders: int = 0
    seen_types: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The unit key."""
        return self.unit.key


def counting_unit(
    key: str = "counter",
    *,
    counts: str | None = "user/message",
    version: int = 1,
    visible: bool = True,
    declared: bool = False,
) -> Spy:
    """A spied unit counting events of type `counts` (every event when None)."""
    spy = Spy()

    def init() -> Count:
        return {"n": 0}

    def apply(state: Count, event: SessionEvent) -> Count:
        spy.applies += 1
        spy.seen_types.append(event.type)
        if counts is None or event.type == counts:
            return {"n": state["n"] + 1}
        return state

    def render(state: Count) -> Count:
        spy.renders += 1
        return {"n": state["n"]}

    spy.unit = ProjectionUnit(
        key=key,
        state_version=version,
        init=init,
        apply=apply,
        state_schema=COUNT,
        view=ClientView(render=render, schema=COUNT) if visible else None,
        event_types=frozenset({counts}) if declared and counts is not None else None,
    )
    return spy


def nullish_unit(key: str = "nullish") -> Spy:
    """`{}` until a `session/title` event; the view is the title or `null` (last wins)."""
    spy = Spy()

    def apply(state: Title, event: SessionEvent) -> Title:
        spy.applies += 1
        if event.type != "session/title":
            return state
        data = event.data
        title = data.get("title") if isinstance(data, dict) else None
        return {"title": title} if isinstance(title, str) else {}

    def render(state: Title) -> str | None:
        spy.renders += 1
        return state.get("title")

    spy.unit = ProjectionUnit(
        key=key,
        state_version=1,
        init=dict,
        apply=apply,
        state_schema=TITLE,
        view=ClientView(render=render, schema=MAYBE_STR),
    )
    return spy


def bomb_unit(key: str = "bomb") -> Spy:
    """A client-visible counter of every event whose `apply` raises on data `{"boom": True}`."""
    spy = Spy()

    def apply(state: Count, event: SessionEvent) -> Count:
        spy.applies += 1
        if event.data == {"boom": True}:
            raise RuntimeError("boom")
        return {"n": state["n"] + 1}

    def render(state: Count) -> Count:
        spy.renders += 1
        return {"n": state["n"]}

    spy.unit = ProjectionUnit(
        key=key,
        state_version=1,
        init=lambda: {"n": 0},
        apply=apply,
        state_schema=COUNT,
        view=ClientView(render=render, schema=COUNT),
    )
    return spy


class Emit:
    """Appends valid events of the kinds the projection tests use."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def user(self, session: Session, text: str = "hi") -> SessionEvent:
        """A `user/message` with a fresh message id."""
        data = {
            "id": f"u{next(self._ids)}",
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"},
        }
        return session.append("user/message", data)

    def title(self, session: Session, title: str) -> SessionEvent:
        """A `session/title` event."""
        return session.append("session/title", {"title": title})

    def turn_start(self, session: Session, turn: int = 1) -> SessionEvent:
        """A `turn/start` event."""
        return session.append("turn/start", {"turn": turn})

    def turn_end(self, session: Session, turn: int = 1) -> SessionEvent:
        """A completed `turn/end` event."""
        return session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def chunk(self, session: Session, text: str = "x", turn: int = 1, step: int = 1) -> SessionEvent:
        """An `assistant/chunk` text delta."""
        return session.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {"type": "text", "text": text}})

    def boom(self, session: Session) -> SessionEvent:
        """The event the `bomb` unit raises on (an opaque known type)."""
        return session.append("goal/change", {"boom": True})

    def by_kind(self, session: Session, kind: str, value: str = "v") -> SessionEvent:
        """Append one event of `kind`, one of `KINDS`."""
        handlers: dict[str, Callable[[Session], SessionEvent]] = {
            "turn/start": self.turn_start,
            "turn/end": self.turn_end,
            "user/message": lambda s: self.user(s, value),
            "session/title": lambda s: self.title(s, value),
            "assistant/chunk": lambda s: self.chunk(s, value),
            "step/start": lambda s: s.append("step/start", {"turn": 1, "step": 1}),
            "goal/change": lambda s: s.append("goal/change", {"goal": value}),
        }
        return handlers[kind](session)


KINDS: tuple[str, ...] = (
    "turn/start",
    "turn/end",
    "user/message",
    "session/title",
    "assistant/chunk",
    "step/start",
    "goal/change",
)


@dataclass(frozen=True)
class Kit:
    """Stateless factories and constants for tests that build their own units (hypothesis too)."""

    counting: Callable[..., Spy] = counting_unit
    nullish: Callable[..., Spy] = nullish_unit
    bomb: Callable[..., Spy] = bomb_unit
    kinds: tuple[str, ...] = KINDS
    count_schema: TypeAdapter[Count] = COUNT
    any_schema: TypeAdapter[Any] = ANY_VIEW
    object_schema: TypeAdapter[dict[str, Any]] = OBJECT


def stored_events(events: Iterable[SessionEvent], start: int = 0) -> StoredEvents:
    """`events[start:]` as a lazily frozen stored log, as a cold read from persistence returns it."""
    return StoredEvents([orjson.loads(orjson.dumps(event)) for event in list(events)[start:]])


def roundtrip(value: Any) -> Any:
    """`value` after a JSON encode and decode (what a stored checkpoint looks like when read back)."""
    return orjson.loads(orjson.dumps(value))


# --------------------------------------------------------------------------------------------------
# The cache stack

STORAGE_KINDS = ("memory", "sqlite", "postgres")
HANG_GUARD_S = 10.0
"""Generous timeout that only guards against hangs; never a timing assertion."""

POLICY = ProjectionCacheConfig(write_every_events=3, write_interval_ms=250, close_timeout_s=5.0, idle_ms=400)
"""The cache stack's policy: count 3, interval 250 ms, and an idle trigger (400 ms) the interval always beats."""
IDLE_POLICY = ProjectionCacheConfig(write_every_events=100, write_interval_ms=10_000, close_timeout_s=5.0, idle_ms=100)
"""A policy whose idle trigger (100 ms) fires long before the count or the interval: parametrize `policy` with it."""


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
        assert isinstance(inner, MemoryCacheStorage | SqliteCacheStorage | PostgresCacheStorage)
        await inner.put_raw(session_id, CacheIdentity(created_at, None, 0), text)

    async def close(self) -> None:
        """Close in the runtime's order: sessions, cache, unit registrations, registry, persistence.

        Sessions go first so their disposal writes reach a cache that is still open; see
        docs/architecture.md#open-and-close-order.
        """
        await self.store.aclose()
        await self.cache.aclose()
        for dispose in self.disposers:
            dispose()
        self.registry.close()
        await self.coordinator.close()


class OwnedPostgresCacheStorage(PostgresCacheStorage):
    """A PostgreSQL cache storage that owns its backend and its throw-away schema (closed and dropped by `aclose`)."""

    schemas: ThrowawaySchemas

    async def aclose(self) -> None:
        """Close the storage, then its backend, then drop the schema."""
        await super().aclose()
        await self.backend.close()
        await asyncio.to_thread(self.schemas.drop_all)


async def open_storage(kind: str, path: Path) -> CacheStorage:
    """A fresh memory storage, a SQLite storage at `path`, or a PostgreSQL storage in a new schema.

    The PostgreSQL one skips the test without a server (`DSH_TEST_POSTGRES_URL`; under CI it fails).
    """
    if kind == "memory":
        return MemoryCacheStorage()
    if kind == "sqlite":
        return await SqliteCacheStorage.open(path)
    schemas = ThrowawaySchemas()
    backend = PostgresBackend(schemas.url, schema=schemas.new())
    try:
        await backend.open()
        storage = await OwnedPostgresCacheStorage.open(backend)
    except BaseException:
        await backend.close()
        await asyncio.to_thread(schemas.drop_all)
        raise
    storage.schemas = schemas
    return storage
