"""`filter_sessions`: the live-preferred corpus restricted by parent, answered by persistence's own filter.

See docs/query.md#filtered-corpus.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsh.abort import AbortController, AbortSignal
from dsh.persistence.base import DamagedSession
from dsh.query import SessionCorpus, SessionFilter, SessionQuery, SessionQueryError, SessionRecord
from dsh.session import HeaderInit, SessionStore
from tests.query.helpers import FakePersistence, Stack, StallingPersistence, closed_log, headers_of, stored_header


async def _family(stack: Stack) -> None:
    """Stored and live sessions under parents P, Q, none and others; `late` stays live and unflushed."""
    store = stack.store
    specs = [
        ("p1", "P", 5, "stored"),
        ("p2", "P", 3, "both"),
        ("p3", "P", 4, "live"),
        ("q1", "Q", 2, "stored"),
        ("r1", "R", 1, "stored"),
        ("top", None, 6, "stored"),
        ("late", "Q", 7, "live"),
    ]
    for session_id, parent, created_at, where in specs:
        session = store.create(session_id, header=HeaderInit(parent_session=parent, created_at=created_at))
        closed_log(session)
        if where == "stored":
            await stack.persist(session)
        elif where == "both":
            await store.flush(session)


@pytest.mark.parametrize(
    "parents",
    [{"P"}, {"P", "Q"}, ["Q", "Q"], {None}, {"P", None}, frozenset(), {"nobody"}, ("R",)],
    ids=["one", "two", "repeated", "parentless", "mixed", "empty", "unknown", "tuple"],
)
async def test_filtered_corpus_equals_the_corpus_restricted_by_parent(stack: Stack, parents: Any) -> None:
    """Same records, flags and order as `list_sessions`, keeping only the parents asked for."""
    await _family(stack)
    query = SessionQuery(stack.store, stack.persistence)
    everything = await query.list_sessions()
    filtered = await query.filter_sessions(SessionFilter(parents=parents))
    wanted = set(parents)
    assert filtered == [record for record in everything if record.header.parent_session in wanted]
    assert isinstance(filtered, SessionCorpus)


async def test_without_parents_the_filter_is_the_whole_corpus(stack: Stack) -> None:
    """`SessionFilter()` does not filter: the result is `list_sessions`'s."""
    await _family(stack)
    query = SessionQuery(stack.store, stack.persistence)
    assert await query.filter_sessions(SessionFilter()) == await query.list_sessions()


async def test_persistence_answers_the_filter_and_reads_no_log(store: SessionStore) -> None:
    """The parents reach `persistence.list` as a frozen copy; nothing is inspected."""
    persistence = FakePersistence(rows=[stored_header(id="x", parentSession="P")])
    records = await SessionQuery(store, persistence).filter_sessions(SessionFilter(parents=["P"]))
    assert persistence.parents == [frozenset({"P"})]
    assert "x" in headers_of(records)
    assert persistence.calls["inspect"] == 0


async def test_the_live_header_decides_the_parent(store: SessionStore) -> None:
    """Stored under X, live under Y: the id is Y's child only (the live record replaces the stored one)."""
    stored = stored_header(id="c", parentSession="X", createdAt=4)
    live = store.create("c", header=HeaderInit(parent_session="Y", created_at=4))
    persistence = FakePersistence(rows=[stored])
    query = SessionQuery(store, persistence)
    assert await query.filter_sessions(SessionFilter(parents={"X"})) == []
    assert await query.filter_sessions(SessionFilter(parents={"Y"})) == [
        SessionRecord(live.header, live=True, persisted=False)
    ]


async def test_unreadable_entries_cover_the_whole_store(store: SessionStore) -> None:
    """Damaged stored entries travel beside every filtered corpus, even an empty one."""
    damaged = DamagedSession("/x/y", "SESSION_CORRUPT", "bad header", "y")
    persistence = FakePersistence(rows=[stored_header(id="a", parentSession="P")], damaged=[damaged])
    records = await SessionQuery(store, persistence).filter_sessions(SessionFilter(parents=set()))
    assert records == []
    assert records.unreadable == (damaged,)
    assert persistence.calls["list"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"parents": "P"},
        SessionFilter(parents="P"),
        SessionFilter(parents=b"P"),  # type: ignore[arg-type]
        SessionFilter(parents={"P": 1}),  # type: ignore[arg-type]
        SessionFilter(parents=[1]),  # type: ignore[list-item]
        SessionFilter(parents=iter(["P"])),  # type: ignore[arg-type]
        None,
    ],
    ids=["dict", "str", "bytes", "mapping", "int-member", "iterator", "none"],
)
async def test_a_malformed_filter_is_refused_before_the_signal_and_any_read(store: SessionStore, bad: Any) -> None:
    """Not a SessionFilter, or parents that is not a collection of ids: INVALID_FILTER, even when aborted."""
    persistence = FakePersistence()
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).filter_sessions(bad, AbortSignal.aborted_with("stop"))
    assert caught.value.code == "SESSION_QUERY_INVALID_FILTER"
    assert persistence.calls["list"] == 0


async def test_parents_are_copied_before_the_first_await(store: SessionStore) -> None:
    """The caller may change its collection while the listing runs: the call keeps the parents it got."""
    persistence = StallingPersistence(
        rows=[stored_header(id="a", parentSession="P"), stored_header(id="b", parentSession="Q")],
        ignore_abort=True,
    )
    parents = {"P"}
    controller = AbortController()
    task = asyncio.create_task(
        SessionQuery(store, persistence).filter_sessions(SessionFilter(parents=parents), controller.signal)
    )
    await asyncio.wait_for(persistence.entered.wait(), 10)
    parents.add("Q")
    assert persistence.parents == [frozenset({"P"})]
    controller.abort("done")
    persistence.release.set()
    with pytest.raises(SessionQueryError) as caught:
        await task
    assert caught.value.code == "SESSION_QUERY_ABORTED"


async def test_a_pre_aborted_signal_lists_nothing(store: SessionStore) -> None:
    """A well-formed filter and an aborted signal: ABORTED with the reason, no persistence call."""
    persistence = FakePersistence()
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).filter_sessions(
            SessionFilter(parents={"P"}), AbortSignal.aborted_with("early")
        )
    assert (caught.value.code, caught.value.reason) == ("SESSION_QUERY_ABORTED", "early")
    assert persistence.calls["list"] == 0


async def test_a_failing_persistence_fails_the_filtered_read(store: SessionStore) -> None:
    """A listing failure is PERSISTENCE_FAILED with the cause kept; never a live-only answer."""
    store.create("live", header=HeaderInit(parent_session="P"))
    failure = OSError("disk gone")
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(list_error=failure)).filter_sessions(SessionFilter(parents={"P"}))
    assert caught.value.code == "SESSION_QUERY_PERSISTENCE_FAILED"
    assert caught.value.__cause__ is failure


async def test_an_abort_during_the_listing_wins_over_its_result(store: SessionStore) -> None:
    """The backend ignores the abort and returns rows: ABORTED all the same, once the call settled."""
    persistence = StallingPersistence(rows=[stored_header(id="a", parentSession="P")], ignore_abort=True)
    controller = AbortController()
    query = SessionQuery(store, persistence)
    task = asyncio.create_task(query.filter_sessions(SessionFilter(parents={"P"}), controller.signal))
    await asyncio.wait_for(persistence.entered.wait(), 10)
    controller.abort("late")
    await asyncio.wait_for(persistence.saw_abort.wait(), 10)
    assert not task.done()
    persistence.release.set()
    with pytest.raises(SessionQueryError) as caught:
        await task
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert persistence.settled == 1


async def test_two_different_stored_headers_of_one_id_conflict(store: SessionStore) -> None:
    """One id listed twice under the asked parent with different headers: SOURCE_CONFLICT."""
    rows = [
        stored_header(id="d", parentSession="P", createdAt=1),
        stored_header(id="d", parentSession="P", createdAt=2),
    ]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(rows=rows)).filter_sessions(SessionFilter(parents={"P"}))
    assert caught.value.code == "SESSION_QUERY_SOURCE_CONFLICT"


async def test_task_cancellation_reaches_the_backend_call(store: SessionStore) -> None:
    """Cancelling the task raises CancelledError, which the stalled backend call receives."""
    persistence = StallingPersistence()
    task = asyncio.create_task(
        SessionQuery(store, persistence).filter_sessions(SessionFilter(parents={"P"}), AbortController().signal)
    )
    await asyncio.wait_for(persistence.entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert persistence.cancelled == 1


async def test_without_persistence_the_filter_applies_to_live_sessions(store: SessionStore) -> None:
    """A live-only corpus is filtered by the live headers."""
    store.create("a", header=HeaderInit(parent_session="P", created_at=1))
    b = store.create("b", header=HeaderInit(parent_session="P", created_at=2))
    store.create("c", header=HeaderInit(parent_session="Q", created_at=3))
    records = await SessionQuery(store).filter_sessions(SessionFilter(parents={"P"}))
    assert headers_of(records) == ["b", "a"]
    assert records[0] == SessionRecord(b.header, live=True, persisted=False)
