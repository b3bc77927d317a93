"""What a listing costs, counted: a live or cached child costs nothing, a seeded cold one exactly one read.

A "log read" is counted by `CountingPersistence` (one cold `inspect`, `read_events` or `prepare`), an
observation by the query spy. Cache rows here are real: written by the projection cache's own
disposal write when a live child goes cold. In-flight bounds are instrumented with gates and the
spy's condition, never with sleeps.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from dsh.abort import AbortSignal
from dsh.persistence.base import PersistenceObservation
from dsh.query import SessionQuery
from dsh.session.header import SessionLogOffset
from dsh.subagent.rows import SubagentChildRow
from dsh.testing.counting import CountingPersistence
from tests.subagent.helpers import (
    Stack,
    desc,
    fork_events,
    open_stack,
)
from tests.subagent.spies import HANG_GUARD_S, SpyQuery


def row(child_id: str, label: str, activity: str) -> SubagentChildRow:
    """A continuable child row."""
    return SubagentChildRow(child_id, "continuable", activity, False, label=label)  # type: ignore[arg-type]


async def test_live_child_costs_zero_observations_and_zero_log_reads(stack: Stack, spy_query: SpyQuery) -> None:
    """A live child — persisted too — costs 0 observations and 0 log reads, listing after listing."""
    child = stack.live_child("live", session_id="live")
    await stack.store.flush(child)
    stack.persistence.reset()
    for _ in range(3):
        assert await stack.list_children() == [row("live", "live", "running")]
    assert spy_query.observations == 0
    assert stack.persistence.reads == Counter()


async def test_unseeded_cold_child_with_a_cache_row_costs_zero(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """An unseeded cold child whose cache row the disposal write produced costs 0 observations, 0 reads."""
    stack = cache_stack
    child = stack.live_child("went cold", session_id="c1")
    await stack.settle(child)
    assert stack.store.get("c1") is None
    assert stack.cache is not None
    header = child.header
    cached = await stack.cache.cached_snapshot(header, SessionLogOffset(0), ("subagent",))
    assert cached is not None
    assert cached.get("subagent") == {"mode": "continuable", "label": "went cold", "seq": 1}
    stack.persistence.reset()
    for _ in range(3):
        assert await stack.list_children() == [row("c1", "went cold", "inactive")]
    assert spy_query.observations == 0
    assert stack.persistence.reads == Counter()


async def test_seeded_cold_child_costs_exactly_one_even_with_a_cache_row(
    cache_stack: Stack, spy_query: SpyQuery
) -> None:
    """A seeded cold child with a real cache row costs exactly one observation and one log read per listing."""
    stack = cache_stack
    child = stack.live_fork_child("fork", own=desc("seeded"))
    await stack.settle(child)
    assert stack.cache_storage is not None
    assert (await stack.cache_storage.inner.get(child.id)) is not None
    stack.persistence.reset()
    for listing in range(1, 4):
        assert await stack.list_children() == [row("fork", "seeded", "inactive")]
        assert spy_query.observed == {"fork": listing}
        assert stack.persistence.reads == {"fork": listing}
    assert stack.cache_storage.gets["fork"] == 0  # never asked: a seeded child's cut is unknown before a read


async def test_mixed_catalog_pays_only_for_misses(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """Live, cached unseeded, uncached unseeded and seeded cold children: reads only for the last two."""
    stack = cache_stack
    stack.live_child("live", session_id="a-live", created_at=1)
    cached = stack.live_child("cached", session_id="b-cached", created_at=2)
    await stack.settle(cached)
    await stack.author_child("c-miss", header={"createdAt": 3}, events=None)
    await stack.author_child("d-fork", header={"createdAt": 4}, events=fork_events(desc("fork")), cut=4)
    stack.persistence.reset()
    rows = await stack.list_children()
    assert rows == [
        row("a-live", "live", "running"),
        row("b-cached", "cached", "inactive"),
        row("c-miss", "c-miss", "inactive"),
        row("d-fork", "fork", "inactive"),
    ]
    assert spy_query.observed == {"c-miss": 1, "d-fork": 1}
    assert stack.persistence.reads == {"c-miss": 1, "d-fork": 1}


class GatedPersistence(CountingPersistence):
    """A counting wrapper whose cold `inspect` waits for a per-id gate; tracks reads in flight."""

    def __init__(self, inner: CountingPersistence) -> None:
        super().__init__(inner.inner)
        self.gates: dict[str, asyncio.Event] = {}
        self.in_flight: list[str] = []
        self.max_in_flight = 0
        self.changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """Enter, wait for the gate, then read through."""
        self.in_flight.append(session_id)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        await self._notify()
        try:
            await self.gates.setdefault(session_id, asyncio.Event()).wait()
            return await super().inspect(session_id, signal=signal)
        finally:
            self.in_flight.remove(session_id)
            await asyncio.shield(self._notify())

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds (re-checked whenever a read enters or leaves)."""
        async with asyncio.timeout(HANG_GUARD_S), self.changed:
            await self.changed.wait_for(predicate)


async def test_cold_reads_in_flight_never_exceed_the_configured_bound(tmp_path: Path) -> None:
    """With `cold_read_concurrency = 3`, 9 seeded cold children: at most 3 log reads in flight, each read once."""
    async with open_stack(tmp_path, concurrency=3) as stack:
        ids = [f"fork{index}" for index in range(9)]
        for index, child_id in enumerate(ids):
            await stack.author_child(child_id, header={"createdAt": index}, events=fork_events(desc(child_id)), cut=4)
        gated = GatedPersistence(stack.persistence)
        stack.services.query = SessionQuery(stack.store, gated)
        task = asyncio.create_task(stack.list_children())
        done = 0
        while done < len(ids):
            await gated.wait_for(lambda done=done: len(gated.in_flight) == min(3, len(ids) - done))
            oldest = gated.in_flight[0]
            gated.gates.setdefault(oldest, asyncio.Event()).set()
            await gated.wait_for(lambda oldest=oldest: oldest not in gated.in_flight)
            done += 1
        async with asyncio.timeout(HANG_GUARD_S):
            rows = await task
        assert gated.max_in_flight == 3
        assert gated.reads == dict.fromkeys(ids, 1)
        assert [r.id for r in rows] == ids
