"""`list_sessions`: the live-preferred corpus, its order, its failures and its cancellation.

See docs/query.md#corpus and docs/query.md#query-cancellation.
"""

from __future__ import annotations

import asyncio

import pytest

from dsh.abort import AbortController, AbortSignal
from dsh.query import SessionQuery, SessionQueryError, SessionRecord
from dsh.session import HeaderInit, SessionStore
from tests.query.helpers import FakePersistence, StallingPersistence, authored, headers_of, stored_header


async def test_a_live_only_corpus_lists_newest_first(store: SessionStore) -> None:
    """Without persistence, live sessions are listed live-only, newest createdAt first."""
    older = store.create("older")
    newer = store.create("newer")
    assert newer.header.created_at > older.header.created_at
    records = await SessionQuery(store).list_sessions()
    assert records == [
        SessionRecord(newer.header, live=True, persisted=False),
        SessionRecord(older.header, live=True, persisted=False),
    ]


async def test_live_header_wins_silently(store: SessionStore, author: SessionStore) -> None:
    """A live header replaces a different persisted header of the same id, with no error."""
    persisted, _ = authored(author, "b", header=HeaderInit(agent_preset="x", created_at=7))
    live = store.create("b", header=HeaderInit(agent_preset="y", created_at=7))
    persistence = FakePersistence(rows=[persisted])
    records = await SessionQuery(store, persistence).list_sessions()
    assert records == [SessionRecord(live.header, live=True, persisted=True)]
    assert records[0].header.agent_preset == "y"
    assert persistence.calls["inspect"] == 0


async def test_records_order_by_created_at_desc_then_id(store: SessionStore) -> None:
    """Ties on createdAt are broken by id ascending; newer createdAt comes first."""
    for session_id, created_at in (("b", 5), ("a", 5), ("c", 9)):
        store.create(session_id, header=HeaderInit(created_at=created_at))
    assert headers_of(await SessionQuery(store).list_sessions()) == ["c", "a", "b"]


async def test_live_and_persisted_records_share_one_order(store: SessionStore) -> None:
    """Persisted-only and live records share one ordering by createdAt desc, then id."""
    store.create("m", header=HeaderInit(created_at=5))
    persistence = FakePersistence(rows=[stored_header(id="z", createdAt=5), stored_header(id="a", createdAt=1)])
    records = await SessionQuery(store, persistence).list_sessions()
    assert [(r.header.id, r.live, r.persisted) for r in records] == [
        ("m", True, False),
        ("z", False, True),
        ("a", False, True),
    ]


async def test_listing_failure_fails_the_whole_call(store: SessionStore) -> None:
    """A failing `list` raises PERSISTENCE_FAILED with the cause kept; no live-only fallback."""
    store.create("live")
    cause = OSError("disk gone")
    query = SessionQuery(store, FakePersistence(list_error=cause))
    with pytest.raises(SessionQueryError) as caught:
        await query.list_sessions()
    error = caught.value
    assert error.code == "SESSION_QUERY_PERSISTENCE_FAILED"
    assert str(error).startswith("session persistence listing failed:")
    assert str(error) == "session persistence listing failed: disk gone"
    assert error.__cause__ is cause
    assert error.session_id is None


async def test_conflicting_persisted_duplicates_are_a_source_conflict(store: SessionStore) -> None:
    """One id listed twice with different headers raises SOURCE_CONFLICT with the exact text."""
    rows = [stored_header(id="d", createdAt=1), stored_header(id="d", createdAt=1, agentPreset="other")]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(rows=rows)).list_sessions()
    assert caught.value.code == "SESSION_QUERY_SOURCE_CONFLICT"
    assert str(caught.value) == 'session source headers conflict for session "d"'
    assert caught.value.session_id == "d"


async def test_identical_persisted_duplicates_collapse(store: SessionStore) -> None:
    """One id listed twice with identical headers yields one record."""
    rows = [stored_header(id="d", createdAt=1), stored_header(id="d", createdAt=1, delegationDepth=0)]
    records = await SessionQuery(store, FakePersistence(rows=rows)).list_sessions()
    assert records == [SessionRecord(rows[0], live=False, persisted=True)]


async def test_conflict_is_not_arbitrated_by_a_live_record(store: SessionStore) -> None:
    """Two different stored headers conflict even when the id is also live."""
    store.create("d")
    rows = [stored_header(id="d", createdAt=1), stored_header(id="d", createdAt=2)]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(rows=rows)).list_sessions()
    assert caught.value.code == "SESSION_QUERY_SOURCE_CONFLICT"


async def test_pre_aborted_signal_never_lists(store: SessionStore) -> None:
    """A pre-aborted signal raises ABORTED carrying its reason, before any persistence call."""
    reason = object()
    persistence = FakePersistence()
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).list_sessions(AbortSignal.aborted_with(reason))
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert caught.value.reason is reason
    assert persistence.calls["list"] == 0


async def test_a_pre_aborted_signal_is_refused_without_persistence(store: SessionStore) -> None:
    """A live-only corpus also refuses a pre-aborted signal."""
    store.create("live")
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store).list_sessions(AbortSignal.aborted_with("stop"))
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert caught.value.reason == "stop"


@pytest.mark.parametrize("ignore_abort", [False, True], ids=["blocking", "ignoring"])
async def test_abort_mid_list_waits_for_settlement(store: SessionStore, ignore_abort: bool) -> None:
    """`list` gets the caller's signal; an abort mid-call raises ABORTED only after it settled."""
    persistence = StallingPersistence(rows=[stored_header(id="p")], ignore_abort=ignore_abort)
    controller = AbortController()
    task = asyncio.create_task(SessionQuery(store, persistence).list_sessions(controller.signal))
    await asyncio.wait_for(persistence.entered.wait(), 10)
    assert persistence.signals == [controller.signal]
    reason = RuntimeError("user pressed stop")
    controller.abort(reason)
    await asyncio.wait_for(persistence.saw_abort.wait(), 10)
    assert not task.done(), "the query must keep awaiting the backend call after the abort"
    persistence.release.set()
    with pytest.raises(SessionQueryError) as caught:
        await asyncio.wait_for(task, 10)
    assert persistence.settled == 1
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert caught.value.reason is reason
    if not ignore_abort:
        assert caught.value.__cause__ is not None
        assert getattr(caught.value.__cause__, "code", None) == "OPERATION_CANCELLED"


async def test_an_abort_after_list_returned_is_still_aborted(store: SessionStore) -> None:
    """An abort observed after a successful `list` still raises ABORTED, never a result."""
    controller = AbortController()

    class AbortingPersistence(FakePersistence):
        async def list(self, **kwargs: object) -> object:  # type: ignore[override]
            listing = await super().list(**kwargs)  # type: ignore[arg-type]
            controller.abort("late")
            return listing

    persistence = AbortingPersistence(rows=[stored_header(id="p")])
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).list_sessions(controller.signal)
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert caught.value.reason == "late"


async def test_task_cancellation_propagates_unchanged(store: SessionStore) -> None:
    """Cancelling the listing task raises CancelledError (not a query error) into the backend call."""
    persistence = StallingPersistence()
    task = asyncio.create_task(SessionQuery(store, persistence).list_sessions(AbortController().signal))
    await asyncio.wait_for(persistence.entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert persistence.cancelled == 1
    assert persistence.settled == 0


async def test_listing_without_persistence_ignores_unpublished(store: SessionStore) -> None:
    """A prepared, unpublished session is not part of the live-only corpus."""
    store.prepare("hidden")
    published = store.create("shown")
    assert await SessionQuery(store).list_sessions() == [SessionRecord(published.header, live=True, persisted=False)]


async def test_session_published_during_listing_is_included(store: SessionStore) -> None:
    """The store is read after the listing settles, so a session published meanwhile appears."""
    published: list[str] = []

    class PublishingPersistence(FakePersistence):
        async def list(self, **kwargs: object) -> object:  # type: ignore[override]
            published.append(store.create("late").id)
            return await super().list(**kwargs)  # type: ignore[arg-type]

    records = await SessionQuery(store, PublishingPersistence()).list_sessions()
    assert published == ["late"]
    assert headers_of(records) == ["late"]
    assert records[0].live


async def test_record_json_carries_the_logical_header(store: SessionStore) -> None:
    """`SessionRecord.to_json` is `{header, live, persisted}` with the wire header (`isSeeded`, no cut)."""
    session = store.create("j", header=HeaderInit(created_at=3, cwd="/w"))
    (record,) = await SessionQuery(store).list_sessions()
    assert record.id == "j"
    assert record.to_json() == {
        "header": {"version": 0, "id": "j", "createdAt": 3, "cwd": "/w", "isSeeded": False, "delegationDepth": 0},
        "live": True,
        "persisted": False,
    }
    assert session.header == record.header
