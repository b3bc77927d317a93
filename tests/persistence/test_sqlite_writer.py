"""The SQLite fixture writer: raw rows behind the backend's back, new revisions, and its refusals."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from dsh.persistence.errors import SessionCorruptionError
from dsh.persistence.sqlite import SqliteBackend
from dsh.testing.sqlite_writer import RawText, SqliteStoredLogWriter

HEADER: dict[str, Any] = {"type": "session", "version": 0, "id": "s1", "createdAt": 10, "delegationDepth": 0}


pytestmark = pytest.mark.usefixtures("strict_sqlite_guard")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """The database file of the test."""
    return tmp_path / "sessions.sqlite3"


@pytest.fixture
def writer(path: Path) -> SqliteStoredLogWriter:
    """The fixture writer over `path`."""
    return SqliteStoredLogWriter(path)


@pytest.fixture
async def backend(path: Path) -> AsyncIterator[SqliteBackend]:
    """An open backend over `path`."""
    async with SqliteBackend(path) as opened:
        yield opened


def notes(start: int, count: int) -> list[dict[str, Any]]:
    """`count` title records from seq `start`."""
    return [
        {"type": "session/title", "seq": seq, "time": seq, "data": {"title": f"n{seq}"}}
        for seq in range(start, start + count)
    ]


async def test_writer_initialises_a_pristine_file_the_backend_then_opens(
    path: Path, writer: SqliteStoredLogWriter
) -> None:
    """Writing before any backend opened creates a valid 0600 store the backend accepts and reads."""
    await writer.write("s1", HEADER, notes(0, 2))
    assert (path.stat().st_mode & 0o777) == 0o600
    async with SqliteBackend(path) as backend:
        log = await backend.load("s1")
    assert log is not None
    assert log.events == notes(0, 2)
    assert dict(log.header) == HEADER


async def test_write_replaces_everything_with_a_new_incarnation(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A second write replaces the rows and the header, and the revision never repeats."""
    await writer.write("s1", HEADER, notes(0, 3))
    first = await backend.read_revision("s1")
    await writer.write("s1", {**HEADER, "createdAt": 11}, notes(0, 1))
    second = await backend.read_revision("s1")
    assert first != second
    log = await backend.load("s1")
    assert log is not None
    assert len(log.events) == 1
    assert log.header["createdAt"] == 11


async def test_append_adds_rows_and_bumps_the_revision(backend: SqliteBackend, writer: SqliteStoredLogWriter) -> None:
    """An external append adds rows, advances next_seq (so the backend continues after it) and bumps the revision."""
    await writer.write("s1", HEADER, notes(0, 2))
    before = await backend.read_revision("s1")
    await writer.append("s1", notes(2, 2))
    after = await backend.read_revision("s1")
    assert after is not None
    assert after != before
    assert after.endswith(":2")
    log = await backend.load("s1")
    assert log is not None
    assert [record["seq"] for record in log.events] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="nothing is stored"):
        await writer.append("missing", notes(0, 1))


async def test_damage_events_keeps_the_header_listable_and_the_log_corrupt(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """After damage the session still lists, its load is SESSION_CORRUPT, and the snapshot changed."""
    await writer.write("s1", HEADER, notes(0, 2))
    await writer.write("empty", {**HEADER, "id": "empty"}, [])
    before = await writer.snapshot("s1")
    await writer.damage_events("s1")
    await writer.damage_events("empty")
    assert await writer.snapshot("s1") != before
    rows, damaged = await backend.list_headers()
    assert sorted(row.record["id"] for row in rows) == ["empty", "s1"]
    assert damaged == []
    for session_id in ("s1", "empty"):
        with pytest.raises(SessionCorruptionError):
            await backend.load(session_id)


async def test_snapshot_is_stable_across_reads_and_empty_for_unknown_ids(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """Reads leave the snapshot unchanged; an unknown id snapshots as no session and no rows."""
    await writer.write("s1", HEADER, notes(0, 2))
    before = await writer.snapshot("s1")
    await backend.load("s1")
    await backend.list_headers()
    assert await writer.snapshot("s1") == before
    assert orjson.loads(await writer.snapshot("missing")) == {"session": None, "events": []}


async def test_raw_text_and_oversized_integers_are_stored_verbatim(writer: SqliteStoredLogWriter, path: Path) -> None:
    """RawText lands in the column unchanged, and integers beyond 64 bits are spelled out exactly."""
    records = [
        {"type": "acme/a", "seq": 0, "time": 0, "data": RawText("{not json")},
        {"type": "acme/b", "seq": 1, "time": 0, "data": {"n": 2**70}, "sourceEventSeqs": RawText("[")},
    ]
    await writer.write("s1", HEADER, records)

    def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
        return conn.execute("SELECT data, source_event_seqs FROM events ORDER BY seq").fetchall()

    def run() -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(path)
        try:
            return read(conn)
        finally:
            conn.close()

    assert await asyncio.to_thread(run) == [("{not json", None), (f'{{"n":{2**70}}}', "[")]


async def test_foreign_versions_and_large_cuts_are_stored_as_given(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """The writer does not validate: a version 1 header and a seedLength past the rows are stored as given."""
    await writer.write("v1", {**HEADER, "id": "v1", "version": 1}, notes(0, 1))
    await writer.write("cut", {**HEADER, "id": "cut", "seedLength": 9}, notes(0, 1))
    rows, _ = await backend.list_headers()
    by_id = {row.record["id"]: row.record for row in rows}
    assert by_id["v1"]["version"] == 1
    assert by_id["cut"]["seedLength"] == 9


@pytest.mark.parametrize(
    ("header", "records", "problem"),
    [
        ({**HEADER, "id": "other"}, [], "keys sessions by id"),
        (HEADER, [{"type": "x", "seq": 0, "time": 0, "data": {}, "extra": 1}], "envelope keys"),
        (HEADER, [{"type": "x", "seq": 0, "time": 0}], "without data"),
        (HEADER, [{"type": "x", "seq": 0, "time": 0, "data": {}, "ignorable": False}], "ignorable"),
    ],
)
async def test_states_the_schema_cannot_hold_are_refused_clearly(
    writer: SqliteStoredLogWriter, header: dict[str, Any], records: list[dict[str, Any]], problem: str
) -> None:
    """A header id other than the row id, unknown envelope keys, missing data or ignorable false raise ValueError."""
    with pytest.raises(ValueError, match=problem):
        await writer.write("s1", header, records)
