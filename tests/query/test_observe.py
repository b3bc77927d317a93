"""`observe_session`: live wins, one cold inspect, failure mapping, cut checks, `expect` and aborts.

See docs/query.md#observations and docs/query.md#query-cancellation.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from dsh.abort import AbortController, AbortSignal
from dsh.persistence.errors import (
    PersistenceIOError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
)
from dsh.query import SessionObservation, SessionQuery, SessionQueryError
from dsh.session import HeaderInit, SessionHeader, SessionId, SessionStore
from tests.query.helpers import (
    WITNESS_CHANGES,
    FakePersistence,
    RaisingPersistence,
    StallingPersistence,
    authored,
    closed_log,
    observation,
    stored_header,
)


async def test_live_observation_never_touches_persistence(store: SessionStore) -> None:
    """A live id is served from the live session (same events, same cut); persistence is never called."""
    parent = store.create("parent")
    closed_log(parent, 2)
    child = store.fork(parent)
    closed_log(child)
    persistence = RaisingPersistence()
    observed = await SessionQuery(store, persistence).observe_session(child.id)
    assert observed.live is True
    assert observed.header == child.header
    assert list(observed.events) == list(child.events)
    assert observed.inherited_event_count == child.inherited_event_count > 0
    assert sum(persistence.calls.values()) == 0


async def test_live_events_are_a_bounded_view(store: SessionStore) -> None:
    """The live events are the session's own objects, not copied, and the view never grows."""
    session = store.create("s")
    closed_log(session)
    observed = await SessionQuery(store).observe_session(session.id)
    length = len(observed.events)
    closed_log(session)
    assert len(observed.events) == length < len(session.events)
    assert all(a is b for a, b in zip(observed.events, session.events, strict=False))
    assert observed.events.backing is session.events.backing  # type: ignore[attr-defined]


async def test_a_cold_seeded_observation_takes_its_cut_from_persistence(
    store: SessionStore, author: SessionStore
) -> None:
    """A cold seeded child is one inspect, no list; the cut and `is_own_seq` come from the observation."""
    parent = author.create("p")
    closed_log(parent, 1)
    child = author.fork(parent)
    author.dispose(child)
    cut = child.inherited_event_count
    assert cut == 4
    persistence = FakePersistence(logs={child.id: observation(child.header, tuple(child.events), cut)})
    signal = AbortController().signal
    observed = await SessionQuery(store, persistence).observe_session(child.id, signal)
    assert persistence.calls == {"inspect": 1}
    assert persistence.signals == [signal]
    assert observed.live is False
    assert observed.inherited_event_count == 4
    assert not observed.is_own_seq(3)
    assert observed.is_own_seq(4)


async def test_cold_events_are_not_copied(store: SessionStore, author: SessionStore) -> None:
    """The cold observation shares the persistence observation's events object."""
    header, events = authored(author, "c")
    stored = observation(header, events)
    observed = await SessionQuery(store, FakePersistence(logs={"c": stored})).observe_session(SessionId("c"))
    assert observed.events is stored.events
    assert observed == SessionObservation(header, events, 0, live=False)


async def test_an_unknown_id_without_persistence_is_not_found(store: SessionStore) -> None:
    """Without persistence an unknown id is SESSION_NOT_FOUND with the exact message."""
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store).observe_session(SessionId("ghost"))
    assert caught.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    assert str(caught.value) == 'session "ghost" not found'
    assert caught.value.session_id == "ghost"


async def test_persistence_not_found_maps_to_session_not_found(store: SessionStore) -> None:
    """Persistence not-found maps to SESSION_NOT_FOUND with the exact message and the cause kept."""
    persistence = FakePersistence()
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).observe_session(SessionId("ghost"))
    assert caught.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    assert str(caught.value) == 'session "ghost" not found'
    assert isinstance(caught.value.__cause__, SessionNotFoundError)
    assert persistence.calls == {"inspect": 1}


@pytest.mark.parametrize(
    ("error", "code", "prefix"),
    [
        (
            SessionCorruptionError('stored session "s" failed validation: bad seq', session_id="s"),
            "SESSION_QUERY_CORRUPT_SESSION",
            'stored session "s" is corrupt: ',
        ),
        (
            SessionFormatUnsupportedError("written by a newer version", session_id="s"),
            "SESSION_QUERY_UNSUPPORTED_FORMAT",
            'stored session "s" uses an unsupported log format: ',
        ),
        (PersistenceIOError("disk gone"), "SESSION_QUERY_PERSISTENCE_FAILED", 'failed to inspect session "s": '),
        (OSError("raw failure"), "SESSION_QUERY_PERSISTENCE_FAILED", 'failed to inspect session "s": '),
    ],
    ids=["corrupt", "format", "io", "other"],
)
async def test_inspect_failures_map_to_their_codes(
    store: SessionStore, error: Exception, code: str, prefix: str
) -> None:
    """Corruption, format refusal and any other failure map to their codes, texts and causes."""
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, FakePersistence(inspect_error=error)).observe_session(SessionId("s"))
    assert caught.value.code == code
    assert str(caught.value) == prefix + str(error)
    assert caught.value.__cause__ is error
    assert caught.value.session_id == "s"


async def test_a_session_published_during_inspect_is_observed_live(store: SessionStore, author: SessionStore) -> None:
    """When the id is published live while `inspect` is pending, the live observation wins."""
    header, events = authored(author, "s", turns=1)
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def hold() -> None:
        entered.set()
        await gate.wait()

    persistence = FakePersistence(logs={"s": observation(header, events)}, on_inspect=hold)
    task = asyncio.create_task(SessionQuery(store, persistence).observe_session(SessionId("s")))
    await asyncio.wait_for(entered.wait(), 10)
    live = store.create("s")
    closed_log(live, 2)
    gate.set()
    observed = await asyncio.wait_for(task, 10)
    assert observed.live is True
    assert observed.header == live.header
    assert list(observed.events) == list(live.events)
    assert persistence.calls == {"inspect": 1}


@pytest.mark.parametrize(
    ("seeded", "cut"),
    [(True, 9), (False, 2), (True, 0), (True, -1)],
    ids=["cut-beyond-log", "unseeded-with-cut", "seeded-without-cut", "negative-cut"],
)
async def test_an_inconsistent_cut_is_corrupt(
    store: SessionStore, author: SessionStore, seeded: bool, cut: int
) -> None:
    """A cut beyond the log, or one contradicting `isSeeded`, is CORRUPT_SESSION."""
    header, events = authored(author, "s", turns=1)
    assert len(events) == 4
    header = dataclasses.replace(header, is_seeded=seeded)
    persistence = FakePersistence(logs={"s": observation(header, events, cut)})
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).observe_session(SessionId("s"))
    assert caught.value.code == "SESSION_QUERY_CORRUPT_SESSION"
    assert str(caught.value).startswith('stored session "s" is corrupt: ')


@pytest.mark.parametrize("field", list(WITNESS_CHANGES))
async def test_a_live_witness_mismatch_is_a_source_conflict(store: SessionStore, field: str) -> None:
    """A live observation differing from `expect` on one witness field is SOURCE_CONFLICT naming it."""
    session = store.create("s", header=HeaderInit(cwd="/w", agent_preset="p"))
    expect = dataclasses.replace(session.header, **WITNESS_CHANGES[field])  # type: ignore[arg-type]
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, RaisingPersistence()).observe_session(session.id, expect=expect)
    assert caught.value.code == "SESSION_QUERY_SOURCE_CONFLICT"
    assert str(caught.value) == f'session "s" changed lifecycle between listing and observation ({field})'


@pytest.mark.parametrize("field", list(WITNESS_CHANGES))
async def test_a_cold_witness_mismatch_is_a_source_conflict(
    store: SessionStore, author: SessionStore, field: str
) -> None:
    """A cold observation differing from `expect` on one witness field is SOURCE_CONFLICT naming it."""
    header, events = authored(author, "s", header=HeaderInit(cwd="/w", agent_preset="p"))
    expect = dataclasses.replace(header, **WITNESS_CHANGES[field])  # type: ignore[arg-type]
    persistence = FakePersistence(logs={"s": observation(header, events)})
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).observe_session(SessionId("s"), expect=expect)
    assert caught.value.code == "SESSION_QUERY_SOURCE_CONFLICT"
    assert str(caught.value) == f'session "s" changed lifecycle between listing and observation ({field})'


async def test_expect_equal_passes_and_absent_depth_equals_zero(store: SessionStore, author: SessionStore) -> None:
    """An equal `expect` passes; a stored header without `delegationDepth` equals depth 0."""
    _, events = authored(author, "s")
    stored = stored_header(id="s", createdAt=1)  # no delegationDepth key in the stored record
    persistence = FakePersistence(logs={"s": observation(stored, events)})
    expect = SessionHeader(version=0, id=SessionId("s"), created_at=1, delegation_depth=0)
    observed = await SessionQuery(store, persistence).observe_session(SessionId("s"), expect=expect)
    assert observed.header == expect
    live = store.create("l")
    assert (await SessionQuery(store).observe_session(live.id, expect=live.header)).live


async def test_an_abort_during_a_successful_inspect_is_aborted(store: SessionStore, author: SessionStore) -> None:
    """An inspect that succeeds after the signal aborted still yields ABORTED, never the result."""
    header, events = authored(author, "s")
    controller = AbortController()

    async def abort() -> None:
        controller.abort("mid-read")

    persistence = FakePersistence(logs={"s": observation(header, events)}, on_inspect=abort)
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).observe_session(SessionId("s"), controller.signal)
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert caught.value.reason == "mid-read"
    assert caught.value.session_id == "s"


@pytest.mark.parametrize(
    "error",
    [OSError("boom"), SessionCorruptionError("bad", session_id="s"), SessionNotFoundError("gone", session_id="s")],
    ids=["io", "corrupt", "not-found"],
)
async def test_an_abort_then_an_inspect_failure_is_aborted(store: SessionStore, error: Exception) -> None:
    """An inspect that aborts and then raises yields ABORTED (not the mapped failure), cause kept."""
    controller = AbortController()

    async def abort() -> None:
        controller.abort("mid-read")

    persistence = FakePersistence(inspect_error=error, on_inspect=abort)
    with pytest.raises(SessionQueryError) as caught:
        await SessionQuery(store, persistence).observe_session(SessionId("s"), controller.signal)
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert caught.value.__cause__ is error


async def test_pre_aborted_observation_reads_nothing(store: SessionStore) -> None:
    """A pre-aborted signal raises ABORTED before any read, even for a live id."""
    store.create("live")
    persistence = FakePersistence()
    query = SessionQuery(store, persistence)
    for session_id in ("live", "cold"):
        with pytest.raises(SessionQueryError) as caught:
            await query.observe_session(SessionId(session_id), AbortSignal.aborted_with("early"))
        assert caught.value.code == "SESSION_QUERY_ABORTED"
        assert caught.value.reason == "early"
    assert sum(persistence.calls.values()) == 0


@pytest.mark.parametrize("ignore_abort", [False, True], ids=["blocking", "ignoring"])
async def test_abort_mid_inspect_waits_for_settlement(
    store: SessionStore, author: SessionStore, ignore_abort: bool
) -> None:
    """An abort during `inspect` is raised as ABORTED only after the backend call settled."""
    header, events = authored(author, "s")
    persistence = StallingPersistence(logs={"s": observation(header, events)}, ignore_abort=ignore_abort)
    controller = AbortController()
    task = asyncio.create_task(SessionQuery(store, persistence).observe_session(SessionId("s"), controller.signal))
    await asyncio.wait_for(persistence.entered.wait(), 10)
    controller.abort("stop")
    await asyncio.wait_for(persistence.saw_abort.wait(), 10)
    assert not task.done()
    persistence.release.set()
    with pytest.raises(SessionQueryError) as caught:
        await asyncio.wait_for(task, 10)
    assert persistence.settled == 1
    assert caught.value.code == "SESSION_QUERY_ABORTED"
    assert persistence.signals == [controller.signal]


async def test_task_cancellation_reaches_inspect(store: SessionStore) -> None:
    """Cancelling an observation task propagates CancelledError into the awaited inspect."""
    persistence = StallingPersistence()
    task = asyncio.create_task(SessionQuery(store, persistence).observe_session(SessionId("s"), AbortSignal.none()))
    await asyncio.wait_for(persistence.entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert persistence.cancelled == 1
