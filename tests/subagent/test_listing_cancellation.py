"""Listing cancellation and the bounded pool of cold reads.

An abort is checked before and after the corpus read, before and after each observation and once after
all cold work (docs/catalog.md#cancellation-checkpoints); at most `cold_read_concurrency` observations
run at once (docs/catalog.md#bounded-cold-reads).

Synchronisation uses events and the spy's condition only: a gated observation waits for its gate,
the test waits until the spy reports the state it needs. No sleeps, no timing assertions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dsh.abort import AbortController, AbortSignal
from dsh.config import Config, SubagentConfig
from dsh.errors import ConfigError
from dsh.projection.unit import ProjectionSnapshot
from dsh.query.records import SessionRecord
from dsh.runtime import Runtime
from dsh.services import Services
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow
from dsh.subagent.runtime import SubagentRuntime
from tests.subagent.helpers import (
    Stack,
    child_events,
    desc,
    fork_events,
    open_stack,
)
from tests.subagent.spies import HANG_GUARD_S, CacheDouble, SnapshotSpy, SpyQuery


def inactive(child_id: str, label: str) -> SubagentChildRow:
    """The row of a cold continuable child."""
    return SubagentChildRow(child_id, "continuable", "inactive", False, label=label)  # type: ignore[arg-type]


def assert_cancelled(error: BaseException) -> None:
    """A plain `SubagentError` with code CANCELLED (never an ExceptionGroup)."""
    assert type(error) is SubagentError
    assert error.code == "CANCELLED"
    assert error.message == "subagent listing was cancelled"


async def _seeded_children(stack: Stack, count: int) -> list[str]:
    ids = [f"fork{index:02d}" for index in range(count)]
    for index, child_id in enumerate(ids):
        await stack.author_child(child_id, header={"createdAt": 10 + index}, events=fork_events(desc(child_id)), cut=4)
    return ids


# ------------------------------------------------------------------------------------------ cancellation


async def test_pre_aborted_signal_never_lists(stack: Stack, spy_query: SpyQuery) -> None:
    """An aborted signal and a `list_sessions` that would fail: CANCELLED, `list_sessions` never called."""
    spy_query.list_failure = RuntimeError("would fail")
    with pytest.raises(SubagentError) as caught:
        await stack.list_children(signal=AbortSignal.aborted_with())
    assert_cancelled(caught.value)
    assert spy_query.lists == 0


async def test_corpus_read_rejecting_on_abort_is_cancelled(stack: Stack, spy_query: SpyQuery) -> None:
    """`list_sessions` rejects when its signal aborts mid-list: CANCELLED."""
    controller = AbortController()
    listing_started = asyncio.Event()

    async def reject_on_abort(signal: AbortSignal | None) -> None:
        assert signal is controller.signal
        listing_started.set()
        await signal.wait()
        raise RuntimeError("listing interrupted")

    spy_query.before_list = reject_on_abort
    task = asyncio.create_task(stack.list_children(signal=controller.signal))
    async with asyncio.timeout(HANG_GUARD_S):
        await listing_started.wait()
    controller.abort()
    with pytest.raises(SubagentError) as caught:
        await task
    assert_cancelled(caught.value)


async def test_abort_while_the_corpus_read_resolves_is_cancelled(stack: Stack, spy_query: SpyQuery) -> None:
    """`list_sessions` resolves after aborting the signal: CANCELLED by the check after it, nothing observed."""
    await stack.author_child("cold")
    controller = AbortController()

    async def abort_then_resolve(records: list[SessionRecord], _signal: object) -> list[SessionRecord]:
        controller.abort()
        return records

    spy_query.after_list = abort_then_resolve
    with pytest.raises(SubagentError) as caught:
        await stack.list_children(signal=controller.signal)
    assert_cancelled(caught.value)
    assert spy_query.observations == 0


async def test_observation_rejecting_on_abort_is_cancelled_not_unavailable(stack: Stack, spy_query: SpyQuery) -> None:
    """An `observe_session` that rejects on abort, aborted mid-observation: CANCELLED, not `unavailable`."""
    await stack.author_child("cold")
    controller = AbortController()

    async def reject_on_abort(_session_id: str, signal: AbortSignal | None) -> None:
        assert signal is controller.signal
        await signal.wait()
        raise RuntimeError("observation interrupted")

    spy_query.before_observe = reject_on_abort
    task = asyncio.create_task(stack.list_children(signal=controller.signal))
    await spy_query.wait_for(lambda: spy_query.in_flight == 1)
    controller.abort()
    with pytest.raises(SubagentError) as caught:
        await task
    assert_cancelled(caught.value)


async def test_observation_succeeding_after_abort_is_cancelled(stack: Stack, spy_query: SpyQuery) -> None:
    """An `observe_session` that succeeds but aborts the signal before returning: CANCELLED by the check after it."""
    await stack.author_child("cold")
    controller = AbortController()

    async def abort_before_returning(_session_id: str, _signal: object) -> None:
        controller.abort()

    spy_query.after_observe = abort_before_returning
    with pytest.raises(SubagentError) as caught:
        await stack.list_children(signal=controller.signal)
    assert_cancelled(caught.value)
    assert spy_query.observed == {"cold": 1}


async def test_abort_during_a_cache_read_is_seen_after_all_cold_work(stack: Stack, spy_query: SpyQuery) -> None:
    """Live children and cache hits, the cache aborting during its read: CANCELLED at the final check, unobserved."""
    stack.live_child("live", session_id="live")
    await stack.author_child("cached-a", events=child_events(desc("a")))
    await stack.author_child("cached-b", events=child_events(desc("b")))
    controller = AbortController()
    hit = ProjectionSnapshot(as_of_seq=3, values={"subagent": {"mode": "continuable", "label": "hit", "seq": 2}})

    async def abort_during_read() -> ProjectionSnapshot:
        controller.abort()
        return hit

    double = CacheDouble(steps=[abort_during_read, hit])
    stack.services.projection_cache = double  # type: ignore[assignment]
    with pytest.raises(SubagentError) as caught:
        await stack.list_children(signal=controller.signal)
    assert_cancelled(caught.value)
    assert spy_query.observations == 0
    assert double.ids() == ["cached-a"]  # after the abort no new cold candidate starts


async def test_in_flight_observation_settles_and_the_error_is_plain(tmp_path: Path) -> None:
    """Concurrency 1, three seeded cold children, abort during the first observation: one observation,
    not task-cancelled, then a plain CANCELLED `SubagentError`."""
    async with open_stack(tmp_path, concurrency=1) as stack:
        await _seeded_children(stack, 3)
        spy = SpyQuery(stack.query)
        stack.services.query = spy  # type: ignore[assignment]
        controller = AbortController()
        outcome: list[str] = []

        async def wait_for_abort(_session_id: str, signal: AbortSignal | None) -> None:
            assert signal is not None
            try:
                await signal.wait()
            except asyncio.CancelledError:
                outcome.append("task-cancelled")
                raise
            outcome.append("received the signal")

        spy.before_observe = wait_for_abort
        task = asyncio.create_task(stack.list_children(signal=controller.signal))
        await spy.wait_for(lambda: spy.in_flight == 1)
        controller.abort()
        with pytest.raises(BaseException) as caught:
            await task
        assert_cancelled(caught.value)
        assert spy.observations == 1
        assert outcome == ["received the signal"]
        assert spy.settled == ["fork00"]


async def test_task_cancel_raises_cancelled_error_and_leaves_no_worker(stack: Stack, spy_query: SpyQuery) -> None:
    """`task.cancel()` on the listing: `asyncio.CancelledError`, and no worker task is left pending."""
    await _seeded_children(stack, 6)
    workers: set[asyncio.Task[object]] = set()
    never = asyncio.Event()

    async def park(_session_id: str, _signal: object) -> None:
        task = asyncio.current_task()
        assert task is not None
        workers.add(task)
        await never.wait()

    spy_query.before_observe = park
    before = asyncio.all_tasks()
    listing = asyncio.create_task(stack.list_children())
    await spy_query.wait_for(lambda: spy_query.in_flight == 4)
    listing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await listing
    assert len(workers) == 4
    assert all(worker.done() for worker in workers)
    leftover = {task for task in asyncio.all_tasks() - before if task is not asyncio.current_task()}
    assert {task for task in leftover if not task.done()} == set()


# ------------------------------------------------------------------------------------------ bounded pool


async def _drive_gated_pool(stack: Stack, spy: SpyQuery, ids: list[str], limit: int) -> list[object]:
    """Gate every observation and release them newest-first, so completion order differs from start order."""
    gates = {child_id: asyncio.Event() for child_id in ids}

    async def gated(session_id: str, _signal: object) -> None:
        await gates[session_id].wait()

    spy.before_observe = gated
    task = asyncio.create_task(stack.list_children())
    released: list[str] = []
    while len(released) < len(ids):
        remaining = len(ids) - len(released)
        await spy.wait_for(lambda remaining=remaining: spy.in_flight == min(limit, remaining))  # type: ignore[misc]
        newest = spy.active[-1]
        released.append(newest)
        gates[newest].set()
        await spy.wait_for(lambda newest=newest: newest in spy.settled)  # type: ignore[misc]
    async with asyncio.timeout(HANG_GUARD_S):
        rows = await task
    assert released != ids  # completion order really differed from candidate order
    return list(rows)


async def test_default_pool_bounds_observations_to_four(stack: Stack, spy_query: SpyQuery) -> None:
    """10 seeded cold children with slow observations: at most 4 in flight, each once, rows in order."""
    ids = await _seeded_children(stack, 10)
    rows = await _drive_gated_pool(stack, spy_query, ids, 4)
    assert spy_query.max_in_flight == 4
    assert spy_query.observed == dict.fromkeys(ids, 1)
    assert rows == [inactive(child_id, child_id) for child_id in ids]


async def test_configured_pool_bounds_observations_to_two(tmp_path: Path) -> None:
    """`cold_read_concurrency = 2`: at most 2 of 10 observations in flight."""
    async with open_stack(tmp_path, concurrency=2) as stack:
        ids = await _seeded_children(stack, 10)
        spy = SpyQuery(stack.query)
        stack.services.query = spy  # type: ignore[assignment]
        rows = await _drive_gated_pool(stack, spy, ids, 2)
        assert spy.max_in_flight == 2
        assert spy.observed == dict.fromkeys(ids, 1)
        assert [row.id for row in rows] == ids  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [0, -1, 65, 1.5, "4", True])
async def test_invalid_concurrency_is_refused_before_any_service(tmp_path: Path, value: object) -> None:
    """0, -1, 65, 1.5, "4" or True as a Python value: CONFIG_INVALID before any service starts."""
    home = tmp_path / "home"
    with pytest.raises(ConfigError) as caught:
        Runtime.open(Config(home=home, subagent={"cold_read_concurrency": value}))
    assert caught.value.code == "CONFIG_INVALID"
    assert not home.exists()
    with pytest.raises(ConfigError):
        SubagentRuntime(Services(), config={"cold_read_concurrency": 4})  # type: ignore[arg-type]


async def test_concurrency_comes_from_the_environment_or_defaults_to_four(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`DSH_SUBAGENT__COLD_READ_CONCURRENCY=8` gives 8; with no setting the runtime uses 4."""
    monkeypatch.delenv("DSH_SUBAGENT__COLD_READ_CONCURRENCY", raising=False)
    async with Runtime.open(Config(home=tmp_path / "a")) as runtime:
        assert runtime.subagents.config.cold_read_concurrency == 4
    monkeypatch.setenv("DSH_SUBAGENT__COLD_READ_CONCURRENCY", "8")
    async with Runtime.open(Config(home=tmp_path / "b")) as runtime:
        assert runtime.subagents.config.cold_read_concurrency == 8
    assert SubagentConfig().cold_read_concurrency == 4


async def test_live_rows_never_wait_for_the_cold_pool(stack: Stack, spy_query: SpyQuery) -> None:
    """4 slow cold and 20 live children: all 20 live rows are read from the live store before any observation starts."""
    cold = await _seeded_children(stack, 4)
    live = [stack.live_child(f"live {index}", session_id=f"live{index:02d}").id for index in range(20)]
    snapshots = SnapshotSpy(stack.registry)
    gate = asyncio.Event()
    seen_at_start: list[int] = []

    async def slow(_session_id: str, _signal: object) -> None:
        seen_at_start.append(len(snapshots.calls))
        await gate.wait()

    spy_query.before_observe = slow
    try:
        task = asyncio.create_task(stack.list_children())
        await spy_query.wait_for(lambda: spy_query.in_flight == 4)
        assert sorted(session_id for session_id, _ in snapshots.calls) == live
        gate.set()
        async with asyncio.timeout(HANG_GUARD_S):
            rows = await task
    finally:
        snapshots.remove()
    assert seen_at_start == [20, 20, 20, 20]
    assert spy_query.observed == dict.fromkeys(cold, 1)
    assert [row.id for row in rows] == cold + live
    assert {row.activity for row in rows[4:]} == {"running"}  # type: ignore[union-attr]


async def test_stray_cancelled_error_is_one_childs_read_failure(tmp_path: Path) -> None:
    """An observation raising `CancelledError` nobody asked for (the listing task is not being
    cancelled) fails that child only: `unavailable`, and the single worker goes on with the queue."""
    async with open_stack(tmp_path, concurrency=1) as stack:
        ids = await _seeded_children(stack, 3)
        spy = SpyQuery(stack.query)
        stack.services.query = spy  # type: ignore[assignment]

        async def stray_cancel(session_id: str, _signal: object) -> None:
            if session_id == ids[0]:
                raise asyncio.CancelledError

        spy.before_observe = stray_cancel
        rows = await stack.list_children()
        assert rows == [
            SubagentDiagnosticRow(ids[0], "unavailable"),
            inactive(ids[1], ids[1]),
            inactive(ids[2], ids[2]),
        ]  # type: ignore[arg-type]
        assert spy.observed == dict.fromkeys(ids, 1)


async def test_stray_cancelled_error_from_the_cache_falls_through(stack: Stack, spy_query: SpyQuery) -> None:
    """A cache read raising a stray `CancelledError` is a cache fault like any other: the observation serves it."""
    await stack.author_child("c1", events=child_events(desc("real label")))
    stack.services.projection_cache = CacheDouble(steps=[asyncio.CancelledError()])  # type: ignore[assignment]
    assert await stack.list_children() == [inactive("c1", "real label")]
    assert spy_query.observed == {"c1": 1}
