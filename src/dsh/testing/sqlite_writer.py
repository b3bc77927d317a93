"""Test support for the SQLite store: the fixture writer and the loop-thread `sqlite3` detector.

Layer: testing (shipped, importable). `SqliteStoredLogWriter` is the `StoredLogWriter` of the
SQLite backend: with its own connection it writes `sessions` and `events` rows directly, with no
validation, so a test can build exactly the state it needs — a header whose `seed_length` exceeds
the rows, a seq gap, a row whose `data` is not JSON (`RawText`), a foreign version — as far as the
schema's column types allow. `SqliteLoopGuard` records every `sqlite3` call made on a thread while
an asyncio event loop runs there, which is how the suite proves that no blocking SQLite call ever
runs on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import Any, Final, Self, TypeVar

import orjson

from dsh.persistence.sqlite import INSERT_EVENT, INSERT_SESSION, header_columns, open_store

__all__ = ["RawText", "SqliteLoopGuard", "SqliteStoredLogWriter", "event_row", "json_text", "next_seq"]

T = TypeVar("T")

_ENVELOPE: Final = frozenset({"type", "seq", "time", "data", "ignorable", "sourceEventSeqs", "surfaceOp"})
_DAMAGED_TEXT: Final = '{"damaged": '
"""What `damage_events` stores in a `data` column: the start of a JSON object that never ends."""


class RawText(str):
    """A JSON column value stored verbatim (for example text that is not JSON at all)."""

    __slots__ = ()


def json_text(value: object) -> str:
    """A JSON column value as stored: `RawText` verbatim, anything else encoded compactly."""
    if isinstance(value, RawText):
        return str(value)
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        # orjson refuses integers beyond 64 bits; tests store them on purpose (format refusals).
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def event_row(session_id: str, record: Mapping[str, Any], *, system: str = "SQLite") -> tuple[Any, ...]:
    """The `events` row for a raw record (same columns in SQLite and PostgreSQL); refuses only what
    the schema cannot hold at all."""
    extra = sorted(set(record) - _ENVELOPE)
    if extra:
        raise ValueError(f"the {system} schema has no column for envelope keys {extra}")
    if "data" not in record:
        raise ValueError(f"the {system} schema cannot store an event record without data")
    ignorable: int | None = None
    if "ignorable" in record:
        if record["ignorable"] is not True:
            raise ValueError(f"the {system} schema stores ignorable only as true (1) or absent (NULL)")
        ignorable = 1
    return (
        session_id,
        record.get("seq"),
        record.get("type"),
        record.get("time"),
        json_text(record["data"]),
        json_text(record["sourceEventSeqs"]) if "sourceEventSeqs" in record else None,
        json_text(record["surfaceOp"]) if "surfaceOp" in record else None,
        ignorable,
    )


def next_seq(rows: Sequence[tuple[Any, ...]], floor: int = 0) -> int:
    """The session's next seq after `rows` (event rows), at least `floor`."""
    seqs = [row[1] for row in rows if type(row[1]) is int]
    return max(floor, max(seqs, default=-1) + 1)


class SqliteStoredLogWriter:
    """Writes stored facts straight into a SQLite store, bypassing the backend and every check.

    Each call opens its own connection on a worker thread (never on the event loop), initialises a
    pristine file exactly as the backend would, and commits one `BEGIN IMMEDIATE` transaction.

    Args:
        path: The database file the backend under test uses.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._in_thread, work)

    def _in_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = open_store(self.path, busy_timeout_ms=5000)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            return result
        finally:
            conn.close()

    async def write(self, session_id: str, header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
        """Store exactly this header and these records under `session_id`, replacing anything stored.

        The `sessions` row gets a fresh incarnation, revision 1 and `next_seq` one past the highest
        record seq. Header keys map to columns (`seedLength` to `seed_length`, ...); other keys
        are dropped.

        Raises:
            ValueError: The header names another id (the schema keys rows by session id, so a
                mismatch cannot be stored), or a record has no column for one of its keys.
        """
        if "id" in header and header["id"] != session_id:
            raise ValueError(
                f"the SQLite schema keys sessions by id: a header id {header['id']!r} differing from "
                f"{session_id!r} cannot be stored"
            )
        rows = [event_row(session_id, record) for record in records]

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            conn.execute(INSERT_SESSION, (session_id, *header_columns(header), uuid.uuid4().hex, 1, next_seq(rows)))
            conn.executemany(INSERT_EVENT, rows)

        await self._run(work)

    async def append(self, session_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records as an external writer would: new rows, a bumped revision and next seq.

        Raises:
            ValueError: Nothing is stored under the id.
        """
        rows = [event_row(session_id, record) for record in records]

        def work(conn: sqlite3.Connection) -> None:
            found = conn.execute("SELECT next_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if found is None:
                raise ValueError(f'nothing is stored for session "{session_id}"')
            conn.executemany(INSERT_EVENT, rows)
            conn.execute(
                "UPDATE sessions SET revision = revision + 1, next_seq = ? WHERE id = ?",
                (next_seq(rows, found[0]), session_id),
            )

        await self._run(work)

    async def damage_events(self, session_id: str) -> None:
        """Make the first event row's `data` undecodable (or add such a row), keeping the header listable.

        Raises:
            ValueError: Nothing is stored under the id.
        """

        def work(conn: sqlite3.Connection) -> None:
            found = conn.execute("SELECT next_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if found is None:
                raise ValueError(f'nothing is stored for session "{session_id}"')
            first = conn.execute(
                "SELECT seq FROM events WHERE session_id = ? ORDER BY seq LIMIT 1", (session_id,)
            ).fetchone()
            if first is None:
                conn.execute(INSERT_EVENT, (session_id, found[0], "turn/end", 0, _DAMAGED_TEXT, None, None, None))
                conn.execute("UPDATE sessions SET next_seq = next_seq + 1 WHERE id = ?", (session_id,))
            else:
                conn.execute(
                    "UPDATE events SET data = ? WHERE session_id = ? AND seq = ?", (_DAMAGED_TEXT, session_id, first[0])
                )
            conn.execute("UPDATE sessions SET revision = revision + 1 WHERE id = ?", (session_id,))

        await self._run(work)

    async def snapshot(self, session_id: str) -> bytes:
        """Every column of the id's `sessions` row and `events` rows, as opaque JSON bytes."""

        def work(conn: sqlite3.Connection) -> bytes:
            session = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
            events = conn.execute("SELECT * FROM events WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
            return orjson.dumps(
                {"session": None if session is None else list(session), "events": [list(row) for row in events]}
            )

        return await self._run(work)

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one SQL statement in its own write transaction and return its rows (raw escape hatch)."""
        return await self._run(lambda conn: conn.execute(sql, tuple(parameters)).fetchall())


# --------------------------------------------------------------------------------------------------
# Loop-thread detector


def _is_sqlite_callable(target: object) -> bool:
    owner = getattr(target, "__self__", None)
    if isinstance(owner, sqlite3.Connection | sqlite3.Cursor | sqlite3.Blob):
        return True
    if isinstance(owner, ModuleType):
        return owner.__name__ in {"_sqlite3", "sqlite3"}
    return getattr(target, "__module__", None) in {"_sqlite3", "sqlite3"}


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SqliteLoopGuard:
    """Records every `sqlite3` call made on this thread while an event loop runs on it.

    A context manager around `sys.setprofile`, which reports each call of a C function on the
    installing thread only: a call into the `sqlite3` driver (`connect`, any connection, cursor
    or blob method) made while an asyncio loop is running on that thread is blocking work on the
    loop, and is recorded with where it came from. Worker threads are not profiled, so the
    backends' own threads cost nothing. A previously installed profiler keeps receiving events.

    Args:
        only_from: Record only calls made directly from source files under this path (for example
            the `dsh` package directory, so a test's own verification queries are not counted).

    Attributes:
        violations: One line per offending call: the callable and the caller's stack.
    """

    def __init__(self, *, only_from: str | None = None) -> None:
        self.violations: list[str] = []
        self._previous: Any = None
        self._only_from = only_from

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if self._previous is not None:
            self._previous(frame, event, arg)
        if (
            event == "c_call"
            and _is_sqlite_callable(arg)
            and (self._only_from is None or frame.f_code.co_filename.startswith(self._only_from))
            and _loop_running()
        ):
            stack = "".join(traceback.format_stack(frame, limit=6))
            self.violations.append(f"sqlite3 {getattr(arg, '__qualname__', arg)!s} called on the event loop:\n{stack}")

    def __enter__(self) -> Self:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        sys.setprofile(self._previous)
        self._previous = None

    def assert_clean(self) -> None:
        """Raise `AssertionError` listing every recorded call, if any."""
        if self.violations:
            raise AssertionError(
                f"{len(self.violations)} sqlite3 call(s) ran on the event loop:\n" + "\n".join(self.violations)
            )


# Shown under the name users import (docs/architecture.md#public-names).
RawText.__module__ = "dsh.testing"
SqliteLoopGuard.__module__ = "dsh.testing"
SqliteStoredLogWriter.__module__ = "dsh.testing"
