"""Spies for the subagent catalog tests: they count and inject, and otherwise delegate to real services.

`SpyQuery` wraps the real `SessionQuery` (the `spy_query` fixture), `SpyCacheStorage` wraps the SQLite
cache storage, `CacheDouble` stands in for `services.projection_cache` where a test scripts its
answers, and `SnapshotSpy` records `ProjectionRegistry.snapshot` calls on one registry.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from dsh.abort import AbortSignal
from dsh.projection.cache import ProjectionCache
from dsh.projection.cache_storage import CacheRecord, SqliteCacheStorage
from dsh.projection.registry import ProjectionRegistry
from dsh.projection.unit import ProjectionSnapshot
from dsh.query import SessionQuery
from dsh.query.records import SessionFilter, SessionObservation, SessionRecord
from dsh.session import Session, SessionHeader, SessionId
from dsh.session.header import SessionLogOffset

HANG_GUARD_S = 10.0  # guards against hangs only; no test waits this long when it passes


class SpyCacheStorage:
    """Wraps the SQLite cache storage: counts gets/puts per id and can fail reads; never changes data."""

    def __init__(self, inner: SqliteCacheStorage) -> None:
        self.inner = inner
        self.gets: Counter[str] = Counter()
        self.puts: Counter[str] = Counter()
        self.deletes = 0
        self.get_failure: BaseException | None = None
        self._written: dict[str, asyncio.Event] = {}

    def written(self, session_id: str) -> asyncio.Event:
        """An event set by every completed put of `session_id`."""
        return self._written.setdefault(session_id, asyncio.Event())

    async def get(self, session_id: SessionId) -> CacheRecord | None:
        """Count, optionally fail, delegate."""
        self.gets[session_id] += 1
        if self.get_failure is not None:
            raise self.get_failure
        return await self.inner.get(session_id)

    async def put(self, session_id: SessionId, record: CacheRecord) -> None:
        """Count and delegate."""
        self.puts[session_id] += 1
        await self.inner.put(session_id, record)
        self.written(session_id).set()

    async def delete(self, session_id: SessionId) -> None:
        """Count and delegate."""
        self.deletes += 1
        await self.inner.delete(session_id)

    async def aclose(self) -> None:
        """Delegate."""
        await self.inner.aclose()


CacheStep = ProjectionSnapshot | BaseException | Callable[[], Awaitable[ProjectionSnapshot | None]] | None


class CacheDouble:
    """Stands in for `services.projection_cache`: records every `cached_snapshot` call.

    Each call consumes the next scripted step (a snapshot, None, an exception to raise, or an async
    callable); with no step left it delegates to `inner` (or answers None without one).
    """

    def __init__(self, inner: ProjectionCache | None = None, steps: Sequence[CacheStep] = ()) -> None:
        self.inner = inner
        self.steps: list[CacheStep] = list(steps)
        self.calls: list[tuple[SessionHeader, int, tuple[str, ...] | None]] = []

    async def cached_snapshot(
        self, header: SessionHeader, inherited_cut: SessionLogOffset, keys: Sequence[str] | None = None
    ) -> ProjectionSnapshot | None:
        """Record the call, then play the next step or delegate."""
        self.calls.append((header, inherited_cut, None if keys is None else tuple(keys)))
        if self.steps:
            step = self.steps.pop(0)
            if isinstance(step, BaseException):
                raise step
            if callable(step):
                return await step()
            return step
        if self.inner is None:
            return None
        return await self.inner.cached_snapshot(header, inherited_cut, keys)

    def ids(self) -> list[str]:
        """The ids `cached_snapshot` was asked about, in call order."""
        return [header.id for header, _, _ in self.calls]


ListHook = Callable[[AbortSignal | None], Awaitable[None]]
RecordsHook = Callable[[list[SessionRecord], AbortSignal | None], Awaitable[list[SessionRecord]]]
ObserveHook = Callable[[str, AbortSignal | None], Awaitable[None]]


class SpyQuery:
    """Wraps the real `SessionQuery`: counts calls per id and injects delays, failures, aborts, headers.

    Attributes:
        lists: Corpus reads (`list_sessions` and `filter_sessions` calls).
        filters: The filters `filter_sessions` was called with, in call order.
        observed: `observe_session` calls per id (counted when the call starts).
        in_flight / max_in_flight / active: observations running now / at most / which ids.
        list_failure: Raised by every corpus read (after `before_list`) instead of listing.
        before_list / after_list: Awaited before every corpus read / given the records it returns
            (may rewrite them). The catalog reads the corpus more than once per call (the children,
            then their children), so a hook meant for the first read only clears itself.
        failures: Per id, raised by `observe_session` (after `before_observe`) instead of observing.
        before_observe: Awaited at the start of every observation (delays, aborts, gates).
        after_observe: Awaited after the inner observation settled, before it is returned.
        header_changes / cut_changes: Per id, fields replaced in the returned observation.
    """

    def __init__(self, inner: SessionQuery) -> None:
        self.inner = inner
        self.lists = 0
        self.filters: list[SessionFilter] = []
        self.observed: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.active: list[str] = []
        self.settled: list[str] = []
        self.list_failure: BaseException | None = None
        self.before_list: ListHook | None = None
        self.after_list: RecordsHook | None = None
        self.failures: dict[str, BaseException] = {}
        self.before_observe: ObserveHook | None = None
        self.after_observe: ObserveHook | None = None
        self.header_changes: dict[str, dict[str, object]] = {}
        self.cut_changes: dict[str, int] = {}
        self.changed = asyncio.Condition()

    @property
    def observations(self) -> int:
        """Observations across every id."""
        return sum(self.observed.values())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds (re-checked at every observation start and end)."""
        async with asyncio.timeout(HANG_GUARD_S), self.changed:
            await self.changed.wait_for(predicate)

    async def list_sessions(self, signal: AbortSignal | None = None) -> list[SessionRecord]:
        """Count, run the hooks, delegate."""
        return await self._corpus_read(lambda: self.inner.list_sessions(signal), signal)

    async def filter_sessions(self, filter: SessionFilter, signal: AbortSignal | None = None) -> list[SessionRecord]:
        """A corpus read like `list_sessions`: counted in `lists`, with the same hooks."""
        self.filters.append(filter)
        return await self._corpus_read(lambda: self.inner.filter_sessions(filter, signal), signal)

    async def _corpus_read(
        self, read: Callable[[], Awaitable[list[SessionRecord]]], signal: AbortSignal | None
    ) -> list[SessionRecord]:
        self.lists += 1
        if self.before_list is not None:
            await self.before_list(signal)
        if self.list_failure is not None:
            raise self.list_failure
        records = await read()
        if self.after_list is not None:
            records = await self.after_list(records, signal)
        return records

    async def observe_session(
        self, session_id: SessionId, signal: AbortSignal | None = None, *, expect: SessionHeader | None = None
    ) -> SessionObservation:
        """Count, track in-flight reads, run the hooks and injections, delegate."""
        self.observed[session_id] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.active.append(session_id)
        await self._notify()
        try:
            if self.before_observe is not None:
                await self.before_observe(session_id, signal)
            failure = self.failures.get(session_id)
            if failure is not None:
                raise failure
            observation = await self.inner.observe_session(session_id, signal, expect=expect)
            if self.after_observe is not None:
                await self.after_observe(session_id, signal)
            changes = self.header_changes.get(session_id)
            if changes is not None:
                observation = dataclasses.replace(
                    observation, header=dataclasses.replace(observation.header, **changes)
                )
            cut = self.cut_changes.get(session_id)
            if cut is not None:
                observation = dataclasses.replace(observation, inherited_event_count=cut)
            return observation
        finally:
            self.in_flight -= 1
            self.active.remove(session_id)
            self.settled.append(session_id)
            # Shielded so that a cancelled observation still wakes waiters.
            await asyncio.shield(self._notify())


class SnapshotSpy:
    """Wraps `ProjectionRegistry.snapshot` on one registry instance; records `(session id, keys)`."""

    def __init__(self, registry: ProjectionRegistry) -> None:
        self.registry = registry
        self.inner = registry.snapshot
        self.calls: list[tuple[str, tuple[str, ...] | None]] = []
        registry.snapshot = self  # type: ignore[method-assign]

    def __call__(self, session: Session, keys: Sequence[str] | None = None) -> ProjectionSnapshot:
        self.calls.append((session.id, None if keys is None else tuple(keys)))
        return self.inner(session, keys)

    def remove(self) -> None:
        """Restore the registry's own method."""
        del self.registry.snapshot
