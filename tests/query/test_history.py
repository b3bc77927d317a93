"""`read_history`: validation, message-aligned pages and the fail-soft projection block.

See docs/query.md#history-pages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh.abort import AbortSignal
from dsh.projection import ProjectionRegistry, ProjectionUnit
from dsh.query import HistoryPage, QueryConfig, SessionQuery, SessionQueryError
from dsh.query.history import is_message_event, page_bounds
from dsh.session import Session, SessionEvent, SessionId, SessionStore, SurfaceReplace
from dsh.session.stored import StoredEvents
from tests.helpers import examples
from tests.query.helpers import FakePersistence, Script, closed_log, counter_unit, observation


def stored_events(events: Any) -> StoredEvents:
    """The events as a lazily frozen stored log (what a real cold read returns)."""
    return StoredEvents([orjson.loads(orjson.dumps(event)) for event in events])


def cold(session: Session, store: SessionStore) -> FakePersistence:
    """Dispose `session` and serve its log as a cold stored observation."""
    store.dispose(session)
    events = stored_events(session.events)
    return FakePersistence(logs={session.id: observation(session.header, events, session.inherited_event_count)})


def messages(page: HistoryPage) -> int:
    """How many history messages the page holds."""
    return sum(1 for event in page.events if is_message_event(event))


def seqs(page: HistoryPage) -> list[int]:
    """The page's seqs."""
    return [event.seq for event in page.events]


@pytest.fixture
def registry(store: SessionStore) -> ProjectionRegistry:
    """A projection registry with the counter unit registered."""
    registry = ProjectionRegistry(store)
    registry.register(counter_unit())
    return registry


async def test_the_tail_page_of_sixty_messages_holds_the_newest_fifty(
    store: SessionStore, registry: ProjectionRegistry
) -> None:
    """60 messages: the tail holds 50, has_more, next_before_seq is its first seq, projections at the end."""
    session = store.create("s")
    closed_log(session, 30)
    query = SessionQuery(store, projections=registry)
    page = await query.read_history(session.id)
    last = session.events[-1].seq
    assert messages(page) == 50
    assert page.has_more is True
    assert page.next_before_seq == page.events[0].seq
    assert page.events[-1].seq == last
    assert page.projections is not None
    assert page.projections.as_of_seq == last
    assert page.projections.get("counter") == {"n": len(session.events)}
    assert page.live is True
    assert page.header == session.header
    assert page.inherited_event_count == 0

    persistence = cold(session, store)
    cold_page = await SessionQuery(store, persistence, projections=registry).read_history(session.id)
    assert cold_page.live is False
    assert cold_page.events == page.events
    assert cold_page.projections == page.projections
    assert persistence.calls == {"inspect": 1}


async def test_the_page_before_the_tail_ends_the_history(store: SessionStore, registry: ProjectionRegistry) -> None:
    """The page before the tail holds the remaining 10 messages and ends the history."""
    session = store.create("s")
    closed_log(session, 30)
    query = SessionQuery(store, projections=registry)
    tail = await query.read_history(session.id)
    older = await query.read_history(session.id, before_seq=tail.next_before_seq)
    assert messages(older) == 10
    assert older.has_more is False
    assert older.next_before_seq is None
    assert older.projections is None
    assert seqs(older) + seqs(tail) == list(range(len(session.events)))


def _cited_log(session: Session) -> None:
    """Seqs 0-18: two exchanges, then user 9, chunks 10-14, assistant 15 citing them, user 16, assistant 17, end 18."""
    script = closed_log(session, 2)
    script.start()
    script.user()
    chunks = [script.chunk().seq for _ in range(5)]
    assert chunks == [10, 11, 12, 13, 14]
    assert script.assistant(sources=chunks).seq == 15
    script.user()
    script.assistant()
    assert script.end().seq == 18


async def test_a_page_pulls_in_the_chunks_its_oldest_message_cites(
    store: SessionStore, registry: ProjectionRegistry
) -> None:
    """The oldest counted message (15) cites chunks 10-14: the page starts at 10, no projections."""
    session = store.create("s")
    _cited_log(session)
    query = SessionQuery(store, projections=registry)
    page = await query.read_history(session.id, before_seq=18, max_messages=3)
    assert seqs(page) == list(range(10, 18))
    assert all(seq < 18 for seq in seqs(page))
    assert page.has_more is True
    assert page.next_before_seq == 10
    assert page.projections is None
    cold_page = await SessionQuery(store, cold(session, store), projections=registry).read_history(
        session.id, before_seq=18, max_messages=3
    )
    assert seqs(cold_page) == list(range(10, 18))
    assert cold_page.projections is None


async def test_a_before_seq_past_the_end_clips_to_the_log(store: SessionStore) -> None:
    """A before_seq past the end clips to the log; it is still not a tail page."""
    session = store.create("s")
    _cited_log(session)
    page = await SessionQuery(store).read_history(session.id, before_seq=10_000, max_messages=1)
    assert seqs(page) == [17, 18]
    assert page.next_before_seq == 17


def _build(session: Session, ops: list[tuple[str, int]]) -> None:
    """Apply random transcript operations to `session` (all valid appends)."""
    script = Script(session)
    script.start()
    surface: list[int] = []
    for op, arg in ops:
        if op == "user":
            surface.append(script.user().seq)
        elif op == "assistant":
            chunks = [script.chunk().seq for _ in range(arg)]
            surface.append(script.assistant(sources=chunks or None).seq)
        elif op == "note":
            script.note()
        elif op == "replace" and surface:
            node = surface[-1]
            message = {
                "id": f"r{node}",
                "role": "assistant",
                "content": [{"type": "text", "text": "edited"}],
                "source": {"kind": "model", "provider": "p", "model": "m"},
            }
            event = session.append(
                "assistant/message",
                {"turn": script.turn, "step": 0, "message": message},
                surface_op=SurfaceReplace(node, node),
                source_event_seqs=[node],
            )
            surface[-1] = event.seq
        elif op == "turn":
            script.end()
            script.start()


_OPS = st.lists(
    st.tuples(st.sampled_from(["user", "assistant", "note", "replace", "turn"]), st.integers(0, 3)), max_size=40
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS, limit=st.integers(1, 6), stored=st.booleans())
def test_paging_back_returns_every_event_once(
    clock: Callable[[], int], ops: list[tuple[str, int]], limit: int, stored: bool
) -> None:
    """Paging back from the tail until has_more is false yields the whole log once, in order."""
    store = SessionStore(clock=clock)
    session = store.create("s")
    _build(session, ops)
    persistence = cold(session, store) if stored else None
    query = SessionQuery(store, persistence)

    async def page_back() -> list[HistoryPage]:
        pages = [await query.read_history(session.id, max_messages=limit)]
        while pages[-1].has_more:
            before = pages[-1].next_before_seq
            pages.append(await query.read_history(session.id, before_seq=before, max_messages=limit))
        return pages

    pages = asyncio.run(page_back())
    collected = [event for page in reversed(pages) for event in page.events]
    assert collected == list(session.events)
    for page in pages[:-1]:
        assert messages(page) >= limit
        assert page.next_before_seq == page.events[0].seq
    assert pages[-1].next_before_seq is None


def test_page_bounds_counts_only_appended_messages() -> None:
    """Replaces and log-only events never count; a short window gives cut 0."""
    store = SessionStore()
    session = store.create("s")
    _build(session, [("user", 0), ("replace", 0), ("note", 0), ("assistant", 2)])
    events = list(session.events)
    # seqs: 0 turn/start, 1 user, 2 replace, 3 note, 4-5 chunks, 6 assistant(4,5)
    assert page_bounds(events, None, 1).start == 4
    assert page_bounds(events, None, 2).start == 1
    assert page_bounds(events, None, 3).start == 0
    assert page_bounds(events, 4, 1).start == 1
    assert page_bounds(stored_events(events), None, 1).start == 4


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 201, "5"])
async def test_an_invalid_limit_is_refused_before_any_read(store: SessionStore, bad: object) -> None:
    """A bad max_messages is INVALID_LIMIT, before the signal and before any read."""
    persistence = FakePersistence()
    query = SessionQuery(store, persistence)
    with pytest.raises(SessionQueryError) as caught:
        await query.read_history(SessionId("s"), max_messages=bad, signal=AbortSignal.aborted_with("x"))  # type: ignore[arg-type]
    assert caught.value.code == "SESSION_QUERY_INVALID_LIMIT"
    assert str(caught.value) == f"history maxMessages must be an integer between 1 and 200, got {bad!r}"
    assert sum(persistence.calls.values()) == 0


@pytest.mark.parametrize("bad", [-1, "3", True, 2.0])
async def test_an_invalid_window_is_refused_before_any_read(store: SessionStore, bad: object) -> None:
    """A bad before_seq is INVALID_WINDOW, before the signal and before any read."""
    persistence = FakePersistence()
    query = SessionQuery(store, persistence)
    with pytest.raises(SessionQueryError) as caught:
        await query.read_history(SessionId("s"), before_seq=bad, signal=AbortSignal.aborted_with("x"))  # type: ignore[arg-type]
    assert caught.value.code == "SESSION_QUERY_INVALID_WINDOW"
    assert str(caught.value) == f"history beforeSeq must be a non-negative integer, got {bad!r}"
    assert sum(persistence.calls.values()) == 0


async def test_the_limit_range_and_default_follow_the_config(store: SessionStore) -> None:
    """The limit range and the default come from QueryConfig."""
    session = store.create("s")
    closed_log(session, 5)
    query = SessionQuery(store, config=QueryConfig(history_default_messages=2, history_max_messages=4))
    assert messages(await query.read_history(session.id)) == 2
    assert messages(await query.read_history(session.id, max_messages=4)) == 4
    with pytest.raises(SessionQueryError) as caught:
        await query.read_history(session.id, max_messages=5)
    assert str(caught.value) == "history maxMessages must be an integer between 1 and 4, got 5"


async def test_before_zero_is_an_empty_page(store: SessionStore, registry: ProjectionRegistry) -> None:
    """before_seq=0 yields an empty page without more and without projections."""
    session = store.create("s")
    closed_log(session, 2)
    page = await SessionQuery(store, projections=registry).read_history(session.id, before_seq=0)
    assert page.events == ()
    assert page.has_more is False
    assert page.next_before_seq is None
    assert page.projections is None


async def test_valid_arguments_with_an_aborted_signal_are_aborted(store: SessionStore) -> None:
    """Valid arguments with a pre-aborted signal raise ABORTED, not a read error."""
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store).read_history(SessionId("ghost"), signal=AbortSignal.aborted_with("x"))
    assert caught.value.code == "SESSION_QUERY_ABORTED"


@pytest.mark.slow
async def test_tail_projections_match_a_growing_log(store: SessionStore, registry: ProjectionRegistry) -> None:
    """While a task keeps appending, every tail page's projections are as of its last event."""
    session = store.create("s")
    script = closed_log(session)
    query = SessionQuery(store, FakePersistence(), projections=registry)
    stop = asyncio.Event()

    async def writer() -> None:
        while not stop.is_set():
            script.exchange(chunks=1)
            await asyncio.sleep(0)  # yield to the reader, not a timing wait

    task = asyncio.create_task(writer())
    try:
        for _ in range(1000):
            page = await query.read_history(session.id)
            assert page.projections is not None
            assert page.projections.as_of_seq == page.events[-1].seq
            assert page.projections.get("counter") == {"n": page.events[-1].seq + 1}
            await asyncio.sleep(0)
    finally:
        stop.set()
        await task
    assert len(session.events) > 1000


def _explode(_state: Mapping[str, Any]) -> object:
    raise RuntimeError("render exploded")


def _apply_explodes(state: Mapping[str, Any], event: SessionEvent) -> Mapping[str, Any]:
    if event.type == "turn/end":
        raise RuntimeError("apply exploded")
    return state


@pytest.mark.parametrize(
    "unit",
    [counter_unit("broken", render=_explode), counter_unit("broken", apply=_apply_explodes)],
    ids=["render-raises", "apply-raises"],
)
async def test_a_broken_unit_leaves_projections_none_and_serves_the_page(
    store: SessionStore, unit: ProjectionUnit[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A raising unit leaves projections None with a warning, live and cold; the page is served."""
    registry = ProjectionRegistry(store)
    registry.register(counter_unit())
    registry.register(unit)
    session = store.create("s")
    with caplog.at_level(logging.ERROR, logger="dsh.projection"):
        closed_log(session, 2)
    query = SessionQuery(store, projections=registry)
    with caplog.at_level(logging.WARNING, logger="dsh.query"):
        caplog.clear()
        page = await query.read_history(session.id)
        assert page.projections is None
        assert list(page.events) == list(session.events)
        warnings = [r.getMessage() for r in caplog.records if r.name.startswith("dsh.query")]
        assert len(warnings) == 1
        assert warnings[0].startswith('history projections unavailable for session "s": ')
        assert caplog.records[-1].levelno == logging.WARNING

        caplog.clear()
        cold_query = SessionQuery(store, cold(session, store), projections=registry)
        cold_page = await cold_query.read_history(session.id)
        assert cold_page.projections is None
        assert cold_page.events == page.events
        cold_warnings = [r.getMessage() for r in caplog.records if r.name.startswith("dsh.query")]
        assert len(cold_warnings) == 1
        assert cold_warnings[0].startswith('history projections unavailable for session "s": ')

    selected = await cold_query.read_history(session.id, projection_keys=["counter"])
    assert selected.projections is not None
    assert selected.projections.values == {"counter": {"n": len(session.events)}}


async def test_without_a_registry_the_page_has_no_projections(store: SessionStore) -> None:
    """Without a registry the tail page has projections=None."""
    session = store.create("s")
    closed_log(session)
    page = await SessionQuery(store).read_history(session.id)
    assert page.projections is None
    assert page.to_json().keys() == {"sessionId", "header", "inheritedEventCount", "live", "events", "hasMore"}


async def test_live_and_cold_tail_pages_agree(store: SessionStore, registry: ProjectionRegistry) -> None:
    """A closed session's tail page read live and again cold after disposal has equal events and values."""
    session = store.create("s")
    closed_log(session, 3, chunks=2)
    live_page = await SessionQuery(store, projections=registry).read_history(session.id)
    cold_page = await SessionQuery(store, cold(session, store), projections=registry).read_history(session.id)
    assert live_page.live
    assert not cold_page.live
    assert cold_page.events == live_page.events
    assert cold_page.projections is not None
    assert live_page.projections is not None
    assert cold_page.projections.values == live_page.projections.values
    assert cold_page.projections.as_of_seq == live_page.projections.as_of_seq


async def test_history_page_json_is_camel_case_and_omits_absent_fields(
    store: SessionStore, registry: ProjectionRegistry
) -> None:
    """`HistoryPage.to_json` is camelCase, carries the cut, and omits nextBeforeSeq/projections when None."""
    parent = store.create("p")
    closed_log(parent, 1)
    child = store.fork(parent, child_id="c")
    Script(child).exchange()
    query = SessionQuery(store, projections=registry)
    tail = (await query.read_history(child.id, max_messages=1)).to_json()
    assert tail["sessionId"] == "c"
    assert tail["inheritedEventCount"] == 4
    assert tail["header"]["isSeeded"] is True  # type: ignore[index]
    assert "seedLength" not in tail["header"]  # type: ignore[operator]
    assert tail["hasMore"] is True
    assert tail["nextBeforeSeq"] == 7
    assert tail["projections"] == {"asOfSeq": 8, "values": {"counter": {"n": 9}}}
    assert tail["events"] == [dict(event) for event in child.events[7:]]
    assert orjson.loads(orjson.dumps(tail)) == tail
    first = (await query.read_history(child.id, before_seq=7)).to_json()
    assert "nextBeforeSeq" not in first
    assert "projections" not in first
    assert first["hasMore"] is False
