"""SQLite backend under write-lock contention: busy timeout and the PERSISTENCE_IO mapping.

Another connection holds the database write lock; an append waits up to the busy timeout, then
fails as `PERSISTENCE_IO` with nothing written (docs/storage-format.md#sqlite-pragmas).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dsh.json import FrozenDict, freeze
from dsh.persistence.errors import PersistenceIOError
from dsh.persistence.sqlite import SqliteBackend
from dsh.session.events import SessionEvent, make_event

HANG_GUARD_S = 30.0
"""Only guards against hangs; every wait below ends on an event long before."""


pytestmark = pytest.mark.usefixtures("strict_sqlite_guard")


class LockHolder:
    """Another connection, on its own thread, holding the database write lock until told to let go."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = threading.Event()
        self.release = threading.Event()
        self._task: asyncio.Task[None] | None = None

    def _hold(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            self.held.set()
            self.release.wait(HANG_GUARD_S)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    async def __aenter__(self) -> LockHolder:
        self._task = asyncio.create_task(asyncio.to_thread(self._hold))
        assert await asyncio.to_thread(self.held.wait, HANG_GUARD_S)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._task is not None
        await self._task


def header() -> FrozenDict:
    """A minimal stored header record."""
    return FrozenDict({"type": "session", "version": 0, "id": "s1", "createdAt": 1, "delegationDepth": 0})


def events(start: int = 0) -> list[SessionEvent]:
    """A two-event batch starting at `start`."""
    return [
        make_event("turn/start", start, 1, freeze({"turn": 0})),
        make_event("turn/end", start + 1, 2, freeze({"turn": 0, "reason": {"kind": "completed"}})),
    ]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """The database file of the test."""
    return tmp_path / "sessions.sqlite3"


@pytest.fixture
async def impatient(path: Path) -> AsyncIterator[SqliteBackend]:
    """An open backend with a 50 ms busy timeout, so a held write lock fails an append quickly."""
    async with SqliteBackend(path, busy_timeout_ms=50) as backend:
        yield backend


async def test_append_while_another_connection_keeps_the_write_lock_is_persistence_io(
    impatient: SqliteBackend, path: Path
) -> None:
    """busy_timeout_ms=50 and the write lock held elsewhere: an append is PERSISTENCE_IO and writes nothing."""
    await impatient.append_batch(header(), events(), materialized=False, fence=None)
    before = await impatient.read_revision("s1")
    async with LockHolder(path):
        with pytest.raises(PersistenceIOError) as caught:
            await impatient.append_batch(header(), events(2), materialized=True, fence=None)
        assert caught.value.code == "PERSISTENCE_IO"
        assert caught.value.session_id == "s1"
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert "locked" in str(caught.value.__cause__)
        # Readers are not blocked by the held write lock (WAL).
        assert await impatient.read_revision("s1") == before
    log = await impatient.load("s1")
    assert log is not None
    assert len(log.events) == 2
    # Once the lock is free the same batch goes through: the failure left no partial state.
    await impatient.append_batch(header(), events(2), materialized=True, fence=None)


async def test_materialization_under_a_held_lock_fails_cleanly(impatient: SqliteBackend, path: Path) -> None:
    """A first batch that cannot get the write lock is PERSISTENCE_IO and nothing is materialized."""
    async with LockHolder(path):
        with pytest.raises(PersistenceIOError):
            await impatient.append_batch(header(), events(), materialized=False, fence=None)
    assert not await impatient.exists("s1")


async def test_append_waiting_on_the_lock_succeeds_once_it_is_released(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default busy timeout, an append that began while the lock was held completes after release."""
    # Observe connections starting a BEGIN IMMEDIATE: SQLite reports a statement to the trace
    # callback when it starts running, before it waits for the lock.
    armed, began = threading.Event(), threading.Event()
    original = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = original(*args, **kwargs)

        def trace(sql: str) -> None:
            if armed.is_set() and sql.startswith("BEGIN IMMEDIATE"):
                began.set()

        conn.set_trace_callback(trace)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    async with SqliteBackend(path) as backend:
        await backend.append_batch(header(), events(), materialized=False, fence=None)
        async with LockHolder(path) as holder:
            armed.set()
            append = asyncio.create_task(backend.append_batch(header(), events(2), materialized=True, fence=None))
            assert await asyncio.to_thread(began.wait, HANG_GUARD_S)
            # The lock is still held, so BEGIN IMMEDIATE cannot have returned: the append is waiting.
            assert not append.done()
            holder.release.set()
            revision = await asyncio.wait_for(append, HANG_GUARD_S)
        assert await backend.read_revision("s1") == revision
        log = await backend.load("s1")
    assert log is not None
    assert [record["seq"] for record in log.events] == [0, 1, 2, 3]
