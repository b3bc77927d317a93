"""Resume: prepare, reservations, publication attach/veto and release.

`prepare` takes the writer lock, reads and repairs the stored log and hands back a prepared session
that is either published (resumed) or closed unpublished (docs/glossary.md#prepared-session).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsh.abort import AbortController
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import (
    LeaseHeldError,
    OperationCancelledError,
    PersistenceClosedError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    SessionLiveError,
)
from dsh.session.errors import SessionError
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend
from dsh.testing.stored_logs import (
    MemoryStoredLogWriter,
    append_closed_turn,
    append_open_step,
    build_records,
    write_stored_log,
)


def closed_turn() -> list[dict[str, Any]]:
    """One complete turn as raw records."""
    return build_records(lambda s: append_closed_turn(s, 1))


async def test_unpublished_close_retires_and_returns_the_read(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """Closing an unpublished preparation retires its session, releases the lock, keeps the read cached."""
    await write_stored_log(writer, "s1", closed_turn())
    prepared = await coordinator.prepare("s1")
    await prepared.close()
    await prepared.close()
    assert prepared.session.state == "retired"
    with pytest.raises(SessionError):
        prepared.publish()
    assert (backend.calls["acquire"], backend.calls["release"]) == (1, 1)
    assert "s1" in coordinator.prepared_cache
    await coordinator.inspect("s1")
    assert backend.calls["load"] == 1


async def test_second_prepare_waits_for_release(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """A second prepare of a reserved id waits until the first reservation is released."""
    await write_stored_log(writer, "s1", closed_turn())
    first = await coordinator.prepare("s1")
    waiting = asyncio.ensure_future(coordinator.prepare("s1"))
    await asyncio.sleep(0)
    assert not waiting.done()
    await first.close()
    second = await waiting
    assert second.session is not first.session
    await second.close()


async def test_second_prepare_refused_once_the_first_is_published(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """A prepare waiting on a reservation that gets published then fails with SESSION_LIVE."""
    await write_stored_log(writer, "s1", closed_turn())
    first = await coordinator.prepare("s1")
    waiting = asyncio.ensure_future(coordinator.prepare("s1"))
    await asyncio.sleep(0)
    first.publish()
    with pytest.raises(SessionLiveError):
        await waiting


async def test_lock_held_elsewhere_reserves_nothing(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """SESSION_LEASE_HELD from acquire fails prepare, loads nothing and leaves the id publishable."""
    await write_stored_log(writer, "s1", closed_turn())
    backend.fail_next("acquire", LeaseHeldError("held", session_id="s1", holder="42@elsewhere"))
    with pytest.raises(LeaseHeldError) as caught:
        await coordinator.prepare("s1")
    assert caught.value.holder == "42@elsewhere"
    assert backend.calls["load"] == 0
    assert backend.calls["release"] == 0
    prepared = await coordinator.prepare("s1")
    await prepared.close()


async def test_failed_repair_releases_the_lock(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """A failing commit_repair fails prepare and releases the writer lock; a retry repairs once."""
    await write_stored_log(writer, "s1", build_records(lambda s: append_open_step(s, 1)))
    backend.fail_next("commit_repair")
    with pytest.raises(PersistenceIOError):
        await coordinator.prepare("s1")
    assert backend.calls["release"] == 1
    async with await coordinator.prepare("s1") as prepared:
        assert prepared.observation.synthetic_tail == 0
    stored = await coordinator.read_events("s1")
    assert [event.type for event in stored.events[3:]] == ["step/end", "turn/end"]


async def test_abort_during_prepare_cleans_up(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """Aborting prepare during its load raises OPERATION_CANCELLED and releases the lock and reservation."""
    await write_stored_log(writer, "s1", closed_turn())
    backend.hold_calls("load")
    controller = AbortController()
    preparing = asyncio.ensure_future(coordinator.prepare("s1", signal=controller.signal))
    await backend.wait_calls("load", 1)
    controller.abort("stop")
    backend.release_calls("load")
    with pytest.raises(OperationCancelledError):
        await preparing
    assert backend.calls["release"] == 1
    prepared = await coordinator.prepare("s1")
    await prepared.close()


async def test_task_cancellation_during_prepare_cleans_up(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """Cancelling the prepare task propagates CancelledError and leaves no reservation or lock behind."""
    await write_stored_log(writer, "s1", closed_turn())
    backend.hold_calls("load")
    preparing = asyncio.ensure_future(coordinator.prepare("s1"))
    await backend.wait_calls("load", 1)
    preparing.cancel()
    backend.release_calls("load")
    with pytest.raises(asyncio.CancelledError):
        await preparing
    assert backend.calls["release"] == 1
    async with await coordinator.prepare("s1"):
        pass


async def test_publish_after_coordinator_close_is_vetoed(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, store: SessionStore, backend: FaultyBackend
) -> None:
    """A prepared session published after close is vetoed with PERSISTENCE_CLOSED; its lock was released."""
    await write_stored_log(writer, "s1", closed_turn())
    prepared = await coordinator.prepare("s1")
    await coordinator.close()
    assert backend.calls["release"] == 1
    with pytest.raises(PersistenceClosedError):
        prepared.publish()
    assert store.get("s1") is None
    await prepared.close()


async def test_cached_ready_entry_vetoes_a_fresh_publication(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, store: SessionStore
) -> None:
    """A ready LRU entry means the id is stored: publishing a fresh session with it is vetoed."""
    await write_stored_log(writer, "s1", closed_turn())
    await coordinator.inspect("s1")
    with pytest.raises(SessionAlreadyExistsError) as caught:
        store.create("s1")
    assert str(caught.value) == 'cannot publish session "s1": persisted state already owns this identity'


async def test_prepared_session_appends_before_publish_are_stored(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, store: SessionStore
) -> None:
    """Events appended to the prepared session before publish are written after the end-seed."""
    await write_stored_log(writer, "s1", closed_turn())
    prepared = await coordinator.prepare("s1")
    prepared.session.append("turn/start", {"turn": 2})
    session = prepared.publish()
    session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
    await store.flush(session)
    stored = await coordinator.read_events("s1")
    assert [event.type for event in stored.events[6:]] == ["session/end-seed", "turn/start", "turn/end"]
    await prepared.close()
    assert store.get("s1") is session


async def test_cut_survives_resume(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, store: SessionStore
) -> None:
    """A resumed seeded session keeps its exact cut; first_live_seq is the stored length."""
    await write_stored_log(writer, "s1", closed_turn(), seedLength=3, parentSession="p")
    prepared = await coordinator.prepare("s1")
    assert prepared.session.inherited_event_count == 3
    assert prepared.session.header.is_seeded is True
    assert prepared.observation.inherited_event_count == 3
    assert prepared.session.first_live_seq == 6
    session = prepared.publish()
    await store.flush(session)
    stored = await coordinator.read_events("s1")
    assert stored.inherited_event_count == 3
    assert stored.header.parent_session == "p"


async def test_close_fails_a_prepare_waiting_on_a_reservation(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """close() with a prepare queued behind an unclosed reservation fails that prepare instead of hanging."""
    await write_stored_log(writer, "s1", closed_turn())
    first = await coordinator.prepare("s1")
    waiting = asyncio.ensure_future(coordinator.prepare("s1"))
    await asyncio.sleep(0)
    await coordinator.close()
    with pytest.raises(PersistenceClosedError):
        await waiting
    await first.close()
