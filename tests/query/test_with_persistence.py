"""The query over the real memory-backed `PersistenceCoordinator`, with spies counting every call.

The spies prove the query is read-only: it lists and inspects, and never writes to the backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from dsh.abort import AbortController
from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError
from dsh.projection import ProjectionRegistry
from dsh.query import SessionQuery, SessionQueryError, SessionRecord
from dsh.session import HeaderInit, SessionId, SessionStore
from tests.query.helpers import WITNESS_CHANGES, Script, Stack, closed_log, counter_unit, store_ids


def _records(log: list[Any]) -> list[dict[str, Any]]:
    return [dict(event) for event in log]


async def test_the_corpus_merges_live_and_persisted_records_live_first(stack: Stack) -> None:
    """Persisted-only A, live-and-persisted B, live-only C: flags by source, live headers win, no inspect."""
    store = stack.store
    a = store.create("a", header=HeaderInit(created_at=3))
    closed_log(a)
    await stack.persist(a)
    b = store.create("b", header=HeaderInit(created_at=2))
    closed_log(b)
    await store.flush(b)
    c = store.create("c", header=HeaderInit(created_at=1))
    closed_log(c)  # never flushed: the batching window never fires
    stack.reset_counts()
    records = await SessionQuery(store, stack.persistence).list_sessions()
    assert records == [
        SessionRecord(a.header, live=False, persisted=True),
        SessionRecord(b.header, live=True, persisted=True),
        SessionRecord(c.header, live=True, persisted=False),
    ]
    assert records[1].header is b.header
    assert stack.persistence.calls == {"list": 1}


async def test_empty_and_unpublished_sessions_are_not_listed(stack: Stack) -> None:
    """A created-but-never-appended session and a prepared, unpublished one are not listed."""
    store = stack.store
    empty = store.create("empty")
    await stack.persist(empty)
    store.prepare("prepared")
    stack.reset_counts()
    assert await SessionQuery(store, stack.persistence).list_sessions() == []
    assert "empty" not in stack.storage.sessions


async def _cold_fork(stack: Stack) -> tuple[Any, Any]:
    """A persisted parent and a persisted fork child seeded with the parent's 4 events."""
    parent = stack.store.create("parent")
    closed_log(parent)
    child = stack.store.fork(parent, child_id="child")
    Script(child).exchange()
    await stack.persist(child)
    await stack.persist(parent)
    return parent, child


async def test_a_seeded_record_exposes_only_is_seeded(stack: Stack) -> None:
    """A persisted fork child (seedLength 4) lists as is_seeded; its JSON has no integer cut."""
    await _cold_fork(stack)
    assert orjson.loads(stack.storage.sessions["child"].header)["seedLength"] == 4
    records = await SessionQuery(stack.store, stack.persistence).list_sessions()
    (record,) = [r for r in records if r.header.id == "child"]
    assert record.header.is_seeded is True
    wire = record.to_json()
    text = orjson.dumps(wire).decode()
    assert wire["header"]["isSeeded"] is True  # type: ignore[index]
    assert "seedLength" not in text
    assert "inheritedEventCount" not in text


async def test_a_cold_seeded_observation_is_one_inspect_with_its_cut(stack: Stack) -> None:
    """A cold fork child is one inspect and no list; cut 4, is_own_seq(3) false, is_own_seq(4) true."""
    _, child = await _cold_fork(stack)
    stack.reset_counts()
    signal = AbortController().signal
    observed = await SessionQuery(stack.store, stack.persistence).observe_session(SessionId("child"), signal)
    assert stack.persistence.calls == {"inspect": 1}
    assert stack.persistence.signals == [signal]
    assert observed.live is False
    assert observed.inherited_event_count == 4
    assert not observed.is_own_seq(3)
    assert observed.is_own_seq(4)
    assert observed.header == child.header
    assert list(observed.events) == list(child.events)


async def test_an_open_turn_is_observed_with_closers_and_never_repaired(stack: Stack) -> None:
    """A cold log ending in an open turn is observed with in-memory closers, twice equal, revision kept."""
    session = stack.store.create("open")
    script = Script(session)
    script.start()
    script.user()
    await stack.persist(session)
    before = await stack.coordinator.revision("open")
    stored_lines = list(stack.storage.sessions["open"].lines)
    stack.reset_counts()
    query = SessionQuery(stack.store, stack.persistence)
    first = await query.observe_session(SessionId("open"))
    second = await query.observe_session(SessionId("open"))
    for observed in (first, second):
        assert len(observed.events) > 2
        assert observed.events[-1].type == "turn/end"
        assert observed.events[-1].data["reason"] == {"kind": "interrupted"}  # type: ignore[index,call-overload]
    assert first == second
    assert await stack.coordinator.revision("open") == before
    assert stack.storage.sessions["open"].lines == stored_lines
    assert stack.backend.mutations() == {}


async def test_an_unknown_id_is_not_found_after_one_inspect(stack: Stack) -> None:
    """An id nobody stored is SESSION_NOT_FOUND after exactly one inspect."""
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(stack.store, stack.persistence).observe_session(SessionId("ghost"))
    assert caught.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    assert str(caught.value) == 'session "ghost" not found'
    assert stack.persistence.calls == {"inspect": 1}


def _header(session_id: str, **extra: object) -> dict[str, object]:
    return {"type": "session", "version": 0, "id": session_id, "createdAt": 1, "delegationDepth": 0, **extra}


def _logged(turns: int = 1) -> list[dict[str, Any]]:
    """A valid closed log as plain records, authored in a throwaway store."""
    other = SessionStore()
    session = other.create("tmp")
    closed_log(session, turns)
    return _records(list(session.events))


async def test_corrupt_and_unsupported_logs_map_to_their_codes(stack: Stack) -> None:
    """A corrupt stored log is CORRUPT_SESSION; a newer format is UNSUPPORTED_FORMAT; causes kept."""
    events = _logged()
    gap = [*events[:2], {**events[2], "seq": 7}, *events[3:]]
    stack.author("corrupt", _header("corrupt"), gap)
    stack.author("newer", _header("newer", version=1), events)
    unknown = {"type": "future/thing", "seq": len(events), "time": 1, "data": {}}
    stack.author("foreign", _header("foreign"), [*events, unknown])
    query = SessionQuery(stack.store, stack.persistence)
    with pytest.raises(SessionQueryError) as corrupt:
        await query.observe_session(SessionId("corrupt"))
    assert corrupt.value.code == "SESSION_QUERY_CORRUPT_SESSION"
    assert str(corrupt.value).startswith('stored session "corrupt" is corrupt: ')
    assert isinstance(corrupt.value.__cause__, SessionCorruptionError)
    for session_id in ("newer", "foreign"):
        with pytest.raises(SessionQueryError) as refused:
            await query.observe_session(SessionId(session_id))
        assert refused.value.code == "SESSION_QUERY_UNSUPPORTED_FORMAT"
        assert str(refused.value).startswith(f'stored session "{session_id}" uses an unsupported log format: ')
        assert isinstance(refused.value.__cause__, SessionFormatUnsupportedError)
    assert stack.backend.mutations() == {}


async def test_any_other_inspect_failure_is_persistence_failed(stack: Stack) -> None:
    """Any other inspect failure (a closed coordinator) is PERSISTENCE_FAILED with the cause kept."""
    await stack.coordinator.close()
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(stack.store, stack.persistence).observe_session(SessionId("x"))
    assert caught.value.code == "SESSION_QUERY_PERSISTENCE_FAILED"
    assert str(caught.value).startswith('failed to inspect session "x": ')
    assert getattr(caught.value.__cause__, "code", None) == "PERSISTENCE_CLOSED"


async def test_a_stored_cut_beyond_the_log_is_corrupt(stack: Stack) -> None:
    """An authored log whose stored cut exceeds its event count is CORRUPT_SESSION."""
    events = _logged()
    stack.author("cut", _header("cut", seedLength=len(events) + 5), events)
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(stack.store, stack.persistence).observe_session(SessionId("cut"))
    assert caught.value.code == "SESSION_QUERY_CORRUPT_SESSION"


@pytest.mark.parametrize("field", list(WITNESS_CHANGES))
async def test_a_stored_witness_mismatch_is_a_source_conflict(stack: Stack, field: str) -> None:
    """A stored session differing from `expect` on one witness field is SOURCE_CONFLICT naming it."""
    session = stack.store.create("w", header=HeaderInit(cwd="/w", agent_preset="p"))
    closed_log(session)
    await stack.persist(session)
    expect = dataclasses.replace(session.header, **WITNESS_CHANGES[field])  # type: ignore[arg-type]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(stack.store, stack.persistence).observe_session(SessionId("w"), expect=expect)
    assert caught.value.code == "SESSION_QUERY_SOURCE_CONFLICT"
    assert str(caught.value) == f'session "w" changed lifecycle between listing and observation ({field})'


async def test_an_absent_delegation_depth_matches_depth_zero(stack: Stack) -> None:
    """A stored header without delegationDepth matches an `expect` with depth 0 (the listed header)."""
    events = _logged()
    header = _header("nodepth")
    del header["delegationDepth"]
    stack.author("nodepth", header, events)
    query = SessionQuery(stack.store, stack.persistence)
    (record,) = await query.list_sessions()
    assert record.header.delegation_depth == 0
    observed = await query.observe_session(SessionId("nodepth"), expect=record.header)
    assert observed.header == record.header


async def test_live_then_cold_tail_pages_agree(stack: Stack) -> None:
    """A closed session's tail page live, then cold after disposal: equal events and projection values."""
    registry = ProjectionRegistry(stack.store)
    registry.register(counter_unit())
    session = stack.store.create("h")
    closed_log(session, 3, chunks=2)
    query = SessionQuery(stack.store, stack.persistence, projections=registry)
    stack.reset_counts()
    live_page = await query.read_history(session.id)
    assert stack.persistence.calls == {}
    await stack.persist(session)
    stack.reset_counts()
    cold_page = await query.read_history(session.id)
    assert stack.persistence.calls == {"inspect": 1}
    assert live_page.live
    assert not cold_page.live
    assert list(cold_page.events) == list(live_page.events)
    assert cold_page.projections is not None
    assert live_page.projections is not None
    assert cold_page.projections.values == live_page.projections.values
    assert cold_page.projections.as_of_seq == live_page.projections.as_of_seq == len(session.events) - 1


async def test_query_never_mutates(stack: Stack) -> None:
    """After every operation persistence saw only list/inspect, no backend write; the store is unchanged."""
    store = stack.store
    registry = ProjectionRegistry(store)
    registry.register(counter_unit())
    parent, child = await _cold_fork(stack)
    open_turn = store.create("open", header=HeaderInit(parent_session="parent"))
    script = Script(open_turn)
    script.start()
    script.user()
    await stack.persist(open_turn)
    live = store.create("live", header=HeaderInit(parent_session="child"))
    closed_log(live, 2)
    await store.flush(live)
    store.prepare("unpublished")
    before = store_ids(store)
    stored_before = {key: (value.header, list(value.lines)) for key, value in stack.storage.sessions.items()}
    stack.reset_counts()

    query = SessionQuery(store, stack.persistence, projections=registry)
    await query.list_sessions()
    for session_id in ("parent", "child", "open", "live"):
        await query.observe_session(SessionId(session_id))
        tail = await query.read_history(SessionId(session_id), max_messages=1)
        if tail.next_before_seq is not None:
            await query.read_history(SessionId(session_id), before_seq=tail.next_before_seq)
        await query.trace_session(SessionId(session_id))
    for failing in (
        query.observe_session(SessionId("ghost")),
        query.read_history(SessionId("ghost")),
        query.trace_session(SessionId("ghost")),
        query.read_history(SessionId("live"), max_messages=0),
    ):
        with pytest.raises(SessionQueryError):
            await failing

    assert set(stack.persistence.calls) <= {"list", "inspect"}
    assert stack.persistence.calls["inspect"] > 0
    assert stack.backend.mutations() == {}
    assert stack.backend.calls["load"] > 0
    assert store_ids(store) == before
    assert store.get("unpublished") is None
    assert {key: (value.header, list(value.lines)) for key, value in stack.storage.sessions.items()} == stored_before
    assert parent.state == child.state == "retired"
