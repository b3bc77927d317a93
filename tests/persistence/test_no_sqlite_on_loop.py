"""No `sqlite3` call ever runs on the event loop.

A blocking database call on the loop thread would stall every other task, so the SQLite backend
does all its database work on worker threads (docs/architecture.md#threads-and-the-event-loop).
`SqliteLoopGuard` profiles the loop thread and records every call into the `sqlite3` driver made
while an event loop runs there. The suite-wide guard in `tests/conftest.py` watches library code in
every test; the SQLite test modules and the SQLite conformance suite add the stricter
`strict_sqlite_guard` fixture, so the whole SQLite suite doubles as the detector's workload. This
module proves the detector is real (it catches a call on the loop and nothing else) and runs one
full backend lifecycle under it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import pytest

from dsh.json import FrozenDict, freeze
from dsh.persistence.sqlite import SqliteBackend
from dsh.session.events import KNOWN_EVENT_TYPES, make_event
from dsh.testing.sqlite_writer import SqliteLoopGuard, SqliteStoredLogWriter


def header(session_id: str) -> FrozenDict:
    """A minimal stored header record."""
    return FrozenDict({"type": "session", "version": 0, "id": session_id, "createdAt": 1, "delegationDepth": 0})


async def test_guard_records_each_sqlite_call_made_on_the_loop() -> None:
    """A connect, execute, fetch and close made on the loop are each recorded and assert_clean fails."""
    with SqliteLoopGuard() as guard:
        conn = sqlite3.connect(":memory:")
        conn.execute("SELECT 1").fetchall()
        conn.close()
    assert len(guard.violations) == 4
    assert "connect" in guard.violations[0]
    assert "test_no_sqlite_on_loop.py" in guard.violations[0]
    with pytest.raises(AssertionError, match="4 sqlite3 call"):
        guard.assert_clean()


@pytest.mark.sqlite_on_loop_on_purpose
async def test_guard_catches_a_call_hidden_inside_library_code_on_the_loop(tmp_path: Path) -> None:
    """A blocking call buried in a helper that runs on the loop is caught, not only direct calls."""
    writer = SqliteStoredLogWriter(tmp_path / "s.sqlite3")
    with SqliteLoopGuard() as guard:
        writer._in_thread(lambda conn: conn.execute("SELECT 1").fetchall())  # deliberately on the loop
    assert guard.violations
    assert any("sqlite_writer.py" in violation for violation in guard.violations)


async def test_guard_ignores_worker_threads() -> None:
    """Calls on worker threads, where blocking is allowed, are not recorded."""

    def work() -> list[tuple[int]]:
        conn = sqlite3.connect(":memory:")
        try:
            return conn.execute("SELECT 1").fetchall()
        finally:
            conn.close()

    with SqliteLoopGuard() as guard:
        assert await asyncio.to_thread(work) == [(1,)]
    guard.assert_clean()


def test_guard_ignores_a_thread_with_no_running_loop() -> None:
    """Synchronous code outside any event loop (a sync test, a CLI) may call sqlite3 freely."""
    with SqliteLoopGuard() as guard:
        sqlite3.connect(":memory:").close()
    guard.assert_clean()


def test_guard_restores_the_previous_profiler() -> None:
    """Leaving the guard reinstates whatever profiler was active, so guards nest."""
    before = sys.getprofile()
    with SqliteLoopGuard() as outer:
        with SqliteLoopGuard():
            pass
        assert sys.getprofile() == outer._profile
    assert sys.getprofile() is before


async def test_whole_backend_lifecycle_makes_no_sqlite_call_on_the_loop(tmp_path: Path) -> None:
    """Open, every read and write, locks, the fixture writer and close run no sqlite3 call on the loop."""
    path = tmp_path / "sessions.sqlite3"
    writer = SqliteStoredLogWriter(path)
    with SqliteLoopGuard() as guard:
        async with SqliteBackend(path) as backend:
            events = [
                make_event("turn/start", 0, 1, freeze({"turn": 0})),
                make_event("step/start", 1, 2, freeze({"turn": 0, "step": 0})),
            ]
            await backend.append_batch(header("a"), events, materialized=False, fence=None)
            closers = [
                make_event("step/end", 2, 2, freeze({"turn": 0, "step": 0})),
                make_event("turn/end", 3, 2, freeze({"turn": 0, "reason": {"kind": "interrupted"}})),
            ]
            await backend.acquire("a")
            await backend.commit_repair(header("a"), None, closers, fence=None)
            await backend.release("a")
            await writer.write("b", header("b"), [dict(event) for event in events])
            await writer.append("b", [dict(closers[0])])
            await writer.snapshot("b")
            await writer.damage_events("b")
            await backend.list_headers()
            await backend.list_headers(parents=frozenset({"a"}))
            await backend.exists("a")
            await backend.read_revision("a")
            await backend.load("a")
            await backend.load_typed("a", frozenset({"turn/end"}), 0, KNOWN_EVENT_TYPES)
            await backend.connection_settings()
            await asyncio.gather(*(backend.load("a") for _ in range(8)))
    guard.assert_clean()
