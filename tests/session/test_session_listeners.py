"""Store notifications: contained listener failures, reentrancy, the created veto, the flush barrier, disposal.

The flush barrier is described in docs/glossary.md#flush-barrier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from dsh.session import Session, SessionError, SessionEvent, SessionStore
from tests.session.helpers import turn_end

_LOGGER = "dsh.session.store"
_GUARD = 5.0  # seconds; only guards against a hang, never measures anything


def _records_naming(caplog: pytest.LogCaptureFixture, session_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == _LOGGER and f'session "{session_id}"' in r.getMessage()]


def test_a_raising_event_listener_is_contained(store: SessionStore, caplog: pytest.LogCaptureFixture) -> None:
    """With three listeners where the second raises, 1 and 3 still see the event and one record is logged."""
    seen: list[tuple[str, SessionEvent]] = []
    store.on_event(lambda s, e: seen.append(("first", e)))

    def broken(session: Session, event: SessionEvent) -> None:
        raise RuntimeError("listener bug")

    store.on_event(broken)
    store.on_event(lambda s, e: seen.append(("third", e)))
    session = store.create()
    with caplog.at_level(logging.ERROR, logger=_LOGGER):
        event = session.append("turn/start", {"turn": 1})
    assert seen == [("first", event), ("third", event)]
    assert session.events[0] is event
    records = _records_naming(caplog, session.id)
    assert len(records) == 1
    assert "session/event listener raised" in records[0].getMessage()
    assert records[0].exc_info is not None


def test_reentrant_append_is_refused_and_contained(store: SessionStore) -> None:
    """A listener appending to the same session gets APPEND_REENTRANT; later listeners still see the event."""
    inner_errors: list[SessionError] = []
    later: list[SessionEvent] = []

    def reenter(session: Session, event: SessionEvent) -> None:
        try:
            session.append("turn/end", turn_end(1))
        except SessionError as error:
            inner_errors.append(error)

    store.on_event(reenter)
    store.on_event(lambda s, e: later.append(e))
    session = store.create()
    event = session.append("turn/start", {"turn": 1})
    assert [error.code for error in inner_errors] == ["APPEND_REENTRANT"]
    assert inner_errors[0].message == "session append cannot reenter while another append is being published"
    assert later == [event]
    assert session.seq == 1


def test_uncaught_reentrant_append_is_logged_not_raised(store: SessionStore, caplog: pytest.LogCaptureFixture) -> None:
    """An uncaught reentrant failure is contained like any listener failure."""
    store.on_event(lambda s, e: s.append("turn/end", turn_end(1)))
    session = store.create()
    with caplog.at_level(logging.ERROR, logger=_LOGGER):
        session.append("turn/start", {"turn": 1})
    assert session.seq == 1
    assert len(_records_naming(caplog, session.id)) == 1
    assert session.append("turn/end", turn_end(1)).seq == 1  # the guard is released afterwards


def test_listener_may_append_to_another_session(store: SessionStore) -> None:
    """A listener that appends to another live session succeeds, and that append is notified too."""
    notified: list[tuple[str, int]] = []
    mirror = store.create("mirror")
    source = store.create("source")

    def listener(session: Session, event: SessionEvent) -> None:
        notified.append((session.id, event.seq))
        if session is source:
            mirror.append("session/title", {"copied": event.seq})

    store.on_event(listener)
    source.append("turn/start", {"turn": 1})
    assert mirror.seq == 1
    assert mirror.events[0].data == {"copied": 0}
    assert notified == [("source", 0), ("mirror", 0)]


async def test_async_listener_failure_is_logged_after_append_returned(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An async listener that raises is logged once it runs; append returned before that."""
    ran = asyncio.Event()

    async def broken(session: Session, event: SessionEvent) -> None:
        ran.set()
        raise RuntimeError("async listener bug")

    store.on_event(broken)
    session = store.create()
    with caplog.at_level(logging.ERROR, logger=_LOGGER):
        event = session.append("turn/start", {"turn": 1})
        assert event.seq == 0
        assert not ran.is_set()  # the coroutine has not started: append did not await it
        assert _records_naming(caplog, session.id) == []
        await asyncio.wait_for(ran.wait(), _GUARD)
        await store.aclose()
    records = _records_naming(caplog, session.id)
    assert len(records) == 1
    assert "session/event listener raised" in records[0].getMessage()


async def test_aclose_awaits_pending_listener_tasks(store: SessionStore) -> None:
    """aclose() disposes sessions and returns only after every async listener task finished."""
    release = asyncio.Event()
    finished: list[int] = []

    async def slow(session: Session, event: SessionEvent) -> None:
        await release.wait()
        finished.append(event.seq)

    disposed = asyncio.Event()
    store.on_event(slow)
    store.on_disposed(lambda s: disposed.set())
    session = store.create()
    session.append("turn/start", {"turn": 1})
    closing = asyncio.create_task(store.aclose())
    # aclose disposes synchronously, then waits for the listener task: once `disposed` is seen,
    # it is parked on that wait, and the slow listener cannot finish before `release`.
    await asyncio.wait_for(disposed.wait(), _GUARD)
    assert session.state == "retired"
    assert not closing.done()
    release.set()
    await asyncio.wait_for(closing, _GUARD)
    assert finished == [0]
    await store.aclose()  # idempotent


def test_async_listener_outside_a_loop_is_logged_and_closed(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An async listener result with no running loop is logged, never left as a never-awaited coroutine."""

    async def listener(session: Session, event: SessionEvent) -> None:
        raise AssertionError("never runs")

    store.on_event(listener)
    session = store.create()
    with caplog.at_level(logging.ERROR, logger=_LOGGER):
        session.append("turn/start", {"turn": 1})
    assert len(_records_naming(caplog, session.id)) == 1


def test_created_veto_rolls_back_publication(store: SessionStore) -> None:
    """A raising created listener vetoes: publish re-raises, get is None, one disposed fired, retired."""
    disposed: list[Session] = []
    later_created: list[Session] = []

    class VetoError(Exception):
        pass

    def veto(session: Session) -> None:
        raise VetoError("identity already owned")

    store.on_created(veto)
    store.on_created(later_created.append)
    store.on_disposed(disposed.append)
    session = store.prepare("a")
    with pytest.raises(VetoError):
        store.publish(session)
    assert store.get("a") is None
    assert disposed == [session]
    assert session.state == "retired"
    assert later_created == []
    with pytest.raises(SessionError) as caught:
        session.append("turn/start", {"turn": 1})
    assert caught.value.code == "SESSION_RETIRED"
    with pytest.raises(SessionError):
        store.publish(session)


def test_created_sees_prepared_events_in_the_log(store: SessionStore) -> None:
    """created fires once per publication; events appended while prepared are read from session.events."""
    seen: list[tuple[str, int]] = []
    notified: list[SessionEvent] = []
    store.on_created(lambda s: seen.append((s.id, len(s.events))))
    store.on_event(lambda s, e: notified.append(e))
    session = store.prepare("p")
    session.append("turn/start", {"turn": 1})
    store.publish(session)
    assert seen == [("p", 1)]
    assert notified == []


async def test_flush_waits_for_all_and_raises_the_first_failure(store: SessionStore) -> None:
    """flush waits for a slow listener after another failed at once, then raises the first failure."""
    release = asyncio.Event()
    failed = asyncio.Event()
    settled: list[str] = []

    class FlushFailedError(Exception):
        pass

    async def fails_at_once(session: Session) -> None:
        failed.set()
        raise FlushFailedError("disk full")

    async def slow(session: Session) -> None:
        await release.wait()
        settled.append("slow")

    store.on_flush(fails_at_once)
    store.on_flush(slow)
    session = store.create()
    flushing = asyncio.create_task(store.flush(session))
    await asyncio.wait_for(failed.wait(), _GUARD)
    assert not flushing.done()  # the slow listener cannot settle before `release`
    release.set()
    with pytest.raises(FlushFailedError):
        await asyncio.wait_for(flushing, _GUARD)
    assert settled == ["slow"]


async def test_flush_failure_order_is_registration_order(store: SessionStore) -> None:
    """When both fail, the first listener in registration order wins, not the first in time."""
    release = asyncio.Event()

    async def first_late(session: Session) -> None:
        await release.wait()
        raise ValueError("first registered")

    async def second_early(session: Session) -> None:
        release.set()
        raise KeyError("second registered")

    store.on_flush(first_late)
    store.on_flush(second_early)
    session = store.create()
    with pytest.raises(ValueError, match="first registered"):
        await asyncio.wait_for(store.flush(session), _GUARD)


async def test_flush_result_says_whether_anyone_participated(store: SessionStore) -> None:
    """flush returns False with no listeners and True when a listener ran."""
    session = store.create()
    assert await store.flush(session) is False
    calls: list[Session] = []

    async def listener(s: Session) -> None:
        calls.append(s)

    unsubscribe = store.on_flush(listener)
    assert await store.flush(session) is True
    assert calls == [session]
    unsubscribe()
    assert await store.flush(session) is False


async def test_flush_of_a_session_not_live_is_refused(store: SessionStore) -> None:
    """Flushing an unpublished or disposed session raises SESSION_NOT_LIVE."""
    prepared = store.prepare("p")
    with pytest.raises(SessionError) as caught:
        await store.flush(prepared)
    assert caught.value.code == "SESSION_NOT_LIVE"
    assert caught.value.message == 'session "p" is not live in this store'
    live = store.create("d")
    store.dispose(live)
    with pytest.raises(SessionError) as caught:
        await store.flush(live)
    assert caught.value.code == "SESSION_NOT_LIVE"


def test_dispose_is_idempotent(store: SessionStore) -> None:
    """Disposing twice notifies once, the second call returns False, and appends raise SESSION_RETIRED."""
    disposed: list[Session] = []
    store.on_disposed(disposed.append)
    session = store.create()
    assert store.dispose(session) is True
    assert store.dispose(session) is False
    assert disposed == [session]
    assert session.state == "retired"
    assert store.get(session.id) is None
    with pytest.raises(SessionError) as caught:
        session.append("turn/start", {"turn": 1})
    assert caught.value.code == "SESSION_RETIRED"


def test_dispose_of_an_unpublished_session_is_false(store: SessionStore) -> None:
    """disposed never fires for an unpublished session."""
    disposed: list[Session] = []
    store.on_disposed(disposed.append)
    assert store.dispose(store.prepare()) is False
    assert disposed == []


def test_disposed_listener_failures_are_contained(store: SessionStore, caplog: pytest.LogCaptureFixture) -> None:
    """A raising disposed listener is logged; later disposed listeners still run."""
    later: list[Session] = []

    def broken(session: Session) -> None:
        raise RuntimeError("bug")

    store.on_disposed(broken)
    store.on_disposed(later.append)
    session = store.create()
    with caplog.at_level(logging.ERROR, logger=_LOGGER):
        assert store.dispose(session) is True
    assert later == [session]
    assert len(_records_naming(caplog, session.id)) == 1


def test_dispose_from_an_event_listener_waits_for_publication(store: SessionStore) -> None:
    """A listener that disposes its session: later listeners still run, disposed fires after unwinding."""
    order: list[str] = []
    store.on_event(lambda s, e: order.append(f"dispose-requested:{store.dispose(s)}"))
    store.on_event(lambda s, e: order.append(f"second:{s.state}"))
    store.on_disposed(lambda s: order.append("disposed"))
    session = store.create()
    event = session.append("turn/start", {"turn": 1})
    order.append("append-returned")
    assert order == ["dispose-requested:True", "second:live", "disposed", "append-returned"]
    assert event.seq == 0
    assert session.state == "retired"
    assert store.get(session.id) is None
    assert store.dispose(session) is False


def test_repeated_dispose_during_publication_notifies_once(store: SessionStore) -> None:
    """Two dispose calls during one publication give one disposed notification."""
    results: list[bool] = []
    disposed: list[Session] = []
    store.on_event(lambda s, e: results.append(store.dispose(s)))
    store.on_event(lambda s, e: results.append(store.dispose(s)))
    store.on_disposed(disposed.append)
    session = store.create()
    session.append("turn/start", {"turn": 1})
    assert results == [True, False]
    assert disposed == [session]


def test_unsubscribe_stops_notifications(store: SessionStore) -> None:
    """Every subscription returns an unsubscribe callable; calling it twice is harmless."""
    seen: list[Any] = []
    unsubscribes = [
        store.on_created(seen.append),
        store.on_event(lambda s, e: seen.append(e)),
        store.on_disposed(seen.append),
    ]
    for unsubscribe in unsubscribes:
        unsubscribe()
        unsubscribe()
    session = store.create()
    session.append("turn/start", {"turn": 1})
    store.dispose(session)
    assert seen == []


def test_listener_subscribed_during_publication_starts_with_the_next_event(store: SessionStore) -> None:
    """The listener snapshot is taken before commit: a listener added mid-publication sees only later events."""
    late: list[int] = []
    subscribed: list[bool] = []

    def subscribe_once(session: Session, event: SessionEvent) -> None:
        if not subscribed:
            subscribed.append(True)
            store.on_event(lambda s, e: late.append(e.seq))

    store.on_event(subscribe_once)
    session = store.create()
    session.append("turn/start", {"turn": 1})
    session.append("turn/end", turn_end(1))
    assert late == [1]


def test_listeners_run_in_registration_order(store: SessionStore) -> None:
    """created, event and disposed listeners run in registration order."""
    order: list[str] = []
    for name in ("a", "b", "c"):
        store.on_created(lambda s, n=name: order.append(f"created-{n}"))
        store.on_event(lambda s, e, n=name: order.append(f"event-{n}"))
        store.on_disposed(lambda s, n=name: order.append(f"disposed-{n}"))
    session = store.create()
    session.append("turn/start", {"turn": 1})
    store.dispose(session)
    assert order == [f"{kind}-{n}" for kind in ("created", "event", "disposed") for n in ("a", "b", "c")]


async def test_store_aclose_reports_a_listener_failure_whose_callback_has_not_run(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """aclose() reports a finished listener task's failure itself, once, even before its done callback ran."""

    async def broken() -> None:
        raise RuntimeError("listener bug")

    failed = asyncio.ensure_future(broken())
    with contextlib.suppress(RuntimeError):
        await failed
    store._tasks[failed] = "s1"
    with caplog.at_level("ERROR", logger="dsh.session.store"):
        await store.aclose()
        store._task_done(failed)  # the late done callback: nothing more to report
    assert [r.getMessage() for r in caplog.records].count(
        "session \"s1\": session/event listener raised: RuntimeError('listener bug')"
    ) == 1
