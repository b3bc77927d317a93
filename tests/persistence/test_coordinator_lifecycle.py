"""Coordinator construction, open/close, idempotent close and the close failure group.

Closing drains every live session before the backend closes, and reports every failure at once
(docs/architecture.md#open-and-close-order).
"""

from __future__ import annotations

import asyncio

import pytest

from dsh.errors import ConfigError
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import PersistenceClosedError, PersistenceIOError
from dsh.persistence.memory import MemoryBackend
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend
from dsh.testing.stored_logs import append_closed_turn, append_note
from dsh.testing.timer import ManualTimer


@pytest.mark.parametrize("value", [0, -1, 2**31, 1.5, True, "200", None])
def test_invalid_window_is_a_config_error(value: object, store: SessionStore) -> None:
    """An out-of-range or non-int window raises CONFIG_INVALID with the pinned text."""
    with pytest.raises(ConfigError) as caught:
        PersistenceCoordinator(MemoryBackend(), store, write_batch_max_delay_ms=value)  # type: ignore[arg-type]
    assert caught.value.code == "CONFIG_INVALID"
    assert str(caught.value) == "write_batch_max_delay_ms must be an integer between 1 and 2147483647"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("value", [0, -3, 2.0, False, "5"])
def test_invalid_cache_size_is_a_config_error(value: object, store: SessionStore) -> None:
    """A non-positive or non-int prepared cache size raises CONFIG_INVALID with the pinned text."""
    with pytest.raises(ConfigError) as caught:
        PersistenceCoordinator(MemoryBackend(), store, prepared_cache_size=value)  # type: ignore[arg-type]
    assert str(caught.value) == "prepared_cache_size must be a positive integer"


def test_limits_are_accepted(store: SessionStore) -> None:
    """The window's bounds 1 and 2147483647 and a cache of one entry are valid."""
    for delay in (1, 2_147_483_647):
        PersistenceCoordinator(MemoryBackend(), store, write_batch_max_delay_ms=delay, prepared_cache_size=1)


async def test_async_with_opens_and_closes_the_backend(store: SessionStore, timer: ManualTimer) -> None:
    """`async with` opens the backend on entry and closes it (after draining) on exit."""
    backend = FaultyBackend(MemoryBackend())
    async with PersistenceCoordinator(backend, store, timer=timer) as coordinator:
        assert backend.calls["open"] == 1
        session = store.create("s1")
        append_closed_turn(session, 1)
    assert coordinator.closed
    assert backend.calls["close"] == 1
    assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 6)]


async def test_close_flushes_live_sessions_and_releases(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """close() writes every live session's buffered events and releases its writer lock."""
    session = store.create("s1")
    append_note(session, 0)
    await coordinator.close()
    assert [(a.session_id, a.count) for a in backend.appends] == [("s1", 1)]
    assert backend.calls["acquire"] == 1
    assert backend.calls["release"] == 1


async def test_sessions_live_at_construction_are_initialised(store: SessionStore, timer: ManualTimer) -> None:
    """A coordinator built after sessions went live writes their events as fresh sessions."""
    session = store.create("early")
    append_closed_turn(session, 1)
    backend = FaultyBackend(MemoryBackend())
    async with PersistenceCoordinator(backend, store, timer=timer):
        await store.flush(session)
        assert [(a.session_id, a.first_seq, a.count, a.materialized) for a in backend.appends] == [
            ("early", 0, 6, False)
        ]


async def test_second_close_is_a_no_op(coordinator: PersistenceCoordinator, backend: FaultyBackend) -> None:
    """A second close() returns at once and never closes the backend twice."""
    await coordinator.close()
    await coordinator.close()
    assert backend.calls["close"] == 1


async def test_concurrent_closes_wait_for_the_first(
    coordinator: PersistenceCoordinator, backend: FaultyBackend
) -> None:
    """A close() racing the first one returns only after the backend was closed."""
    backend.hold_calls("close")
    first = asyncio.ensure_future(coordinator.close())
    await backend.wait_calls("close", 1)
    second = asyncio.ensure_future(coordinator.close())
    await asyncio.sleep(0)
    assert not second.done()
    backend.release_calls("close")
    await asyncio.gather(first, second)


async def test_close_failures_are_grouped(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """Every failure during close is raised together as "<backend> close failed"."""
    session = store.create("s1")
    append_note(session, 0)
    backend.fail_always("append_batch")
    backend.fail_next("close")
    with pytest.raises(ExceptionGroup) as caught:
        await coordinator.close()
    assert str(caught.value).startswith("memory close failed")
    assert len(caught.value.exceptions) == 2
    assert all(isinstance(error, PersistenceIOError) for error in caught.value.exceptions)
    await coordinator.close()


async def test_after_close_flush_and_drain_raise_closed(
    coordinator: PersistenceCoordinator, store: SessionStore
) -> None:
    """After close, a store flush and drain() raise PERSISTENCE_CLOSED; later events are ignored."""
    session = store.create("s1")
    await coordinator.close()
    append_note(session, 0)
    with pytest.raises(PersistenceClosedError):
        await store.flush(session)
    with pytest.raises(PersistenceClosedError):
        await coordinator.drain("s1")


async def test_locate_is_none_for_memory(coordinator: PersistenceCoordinator, store: SessionStore) -> None:
    """locate() answers without I/O, None for a backend without artifact paths."""
    session = store.create("s1")
    assert coordinator.locate(session.header) is None


async def test_close_returns_when_a_finished_retirement_was_not_yet_forgotten(store: SessionStore) -> None:
    """close() drops finished retirements itself instead of waiting for their done callbacks, which on
    Python 3.12+ have not run yet when a gather of finished tasks returns (it then spun forever)."""
    coordinator = PersistenceCoordinator(MemoryBackend(), store)
    await coordinator.open()

    async def retired() -> None:
        return None

    finished = asyncio.ensure_future(retired())
    await finished
    # A finished retirement whose done callback has not run: only a waiter can drop it.
    coordinator._state.retiring["s1"] = {finished}
    await asyncio.wait_for(coordinator.close(), 5)
    assert coordinator._state.retiring == {}
