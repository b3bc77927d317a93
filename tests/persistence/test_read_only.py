"""Read-only backends create and change nothing; SQLite lookups of ids no store can hold are "not stored".

`JsonlBackend(read_only=True)` sweeps no temp file and refuses every write, repair and writer lock.
`SqliteBackend(read_only=True)` opens with `mode=ro`: a missing file (or folder) is one clear
`STORE_MISCONFIGURED` error and nothing is created, a 0-byte file is reported and left alone (a
writing open initialises it, with a WARNING), a store is verified but never initialised
(docs/storage-format.md#read-only-opens). Every check compares a tree snapshot taken before and
after (SQLite's `-wal`/`-shm` files left out).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from dsh.persistence.errors import SessionNotFoundError, StoreMisconfiguredError
from dsh.persistence.sqlite import SqliteBackend
from dsh.session.events import SessionEvent
from dsh.testing.sqlite_writer import SqliteStoredLogWriter
from dsh.testing.stored_logs import stored_header
from tests.helpers import tree_snapshot
from tests.persistence.helpers import closed_records, make_backend, make_writer, open_step_records, running

LONE_SURROGATE = "child-\udcff"


# ---------------------------------------------------------------- JSONL


async def test_a_read_only_jsonl_backend_reads_and_changes_nothing(tmp_path: Path, compression: str) -> None:
    """Listing, inspecting and reading a store read-only leaves it byte for byte (a stale temp file stays)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("s1"), open_step_records())
    stale = Path(writer.path_of("s1") + ".0123456789ab.tmp")
    stale.write_bytes(b"left by a crash")
    before = tree_snapshot(tmp_path)
    async with running(make_backend(root, compression, read_only=True)) as (coordinator, _):
        assert [row.header.id for row in await coordinator.list()] == ["s1"]
        assert (await coordinator.inspect("s1")).synthetic_tail > 0
        await coordinator.read_events("s1")
        await coordinator.revision("s1")
        with pytest.raises(StoreMisconfiguredError, match="read-only"):
            await coordinator.prepare("s1")
    assert tree_snapshot(tmp_path) == before


async def test_a_read_only_jsonl_backend_refuses_every_write(tmp_path: Path) -> None:
    """Materializing, appending and repairing through a read-only backend are refused before any I/O."""
    root = tmp_path / "sessions"
    backend = make_backend(root, "zstd", read_only=True)
    await backend.open()
    header = stored_header("s1")
    event = SessionEvent(closed_records(1)[0])
    try:
        for attempt in (
            backend.append_batch(header, [event], materialized=False, fence=None),  # type: ignore[arg-type]
            backend.append_batch(header, [event], materialized=True, fence=None),  # type: ignore[arg-type]
            backend.commit_repair(header, None, [event], fence=None),  # type: ignore[arg-type]
            backend.acquire("s1"),
        ):
            with pytest.raises(StoreMisconfiguredError, match="read-only"):
                await attempt
    finally:
        await backend.close()
    assert not root.exists()
    assert not Path(f"{root}.locks").exists()


# ---------------------------------------------------------------- SQLite


async def _sqlite_store(path: Path) -> None:
    writer = SqliteStoredLogWriter(path)
    await writer.write("s1", stored_header("s1"), closed_records(1))
    await writer.write("child", stored_header("child", parentSession="s1"), closed_records(1))


async def test_a_read_only_sqlite_open_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    """A store file (and folder) that does not exist: one `STORE_MISCONFIGURED` error, no folder or file made."""
    before = tree_snapshot(tmp_path)
    backend = SqliteBackend(tmp_path / "missing" / "sessions.sqlite3", read_only=True)
    with pytest.raises(StoreMisconfiguredError, match="no SQLite session store"):
        await backend.open()
    await backend.close()
    assert tree_snapshot(tmp_path) == before


async def test_a_zero_byte_store_is_reported_read_only_and_initialised_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0-byte store: a read-only open refuses it and leaves it; a writing open initialises it and warns."""
    path = tmp_path / "sessions.sqlite3"
    path.touch(mode=0o600)
    before = tree_snapshot(tmp_path)
    reader = SqliteBackend(path, read_only=True)
    with pytest.raises(StoreMisconfiguredError, match="empty file"):
        await reader.open()
    await reader.close()
    assert tree_snapshot(tmp_path) == before
    with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
        async with SqliteBackend(path) as writer:
            assert await writer.list_headers() == ([], [])
    assert path.stat().st_size > 0
    assert any("empty file" in record.getMessage() for record in caplog.records if record.levelno == logging.WARNING)


async def test_a_fresh_writing_open_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Creating a new store file is no 0-byte store: no WARNING."""
    with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
        async with SqliteBackend(tmp_path / "sessions.sqlite3"):
            pass
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []


async def test_a_read_only_sqlite_backend_reads_and_changes_nothing(tmp_path: Path) -> None:
    """A read-only SQLite store lists and reads; every write and lock is refused; the files stay as they were."""
    path = tmp_path / "sessions.sqlite3"
    await _sqlite_store(path)
    before = tree_snapshot(tmp_path)
    backend = SqliteBackend(path, read_only=True, busy_timeout_ms=50)
    async with running(backend) as (coordinator, _):
        assert sorted(row.header.id for row in await coordinator.list()) == ["child", "s1"]
        assert len((await coordinator.inspect("s1")).events) == len(closed_records(1))
        await coordinator.read_events("s1", types=["turn/end"])
        with pytest.raises(StoreMisconfiguredError, match="read-only"):
            await coordinator.prepare("s1")
        with pytest.raises(StoreMisconfiguredError, match="read-only"):
            await backend.append_batch(stored_header("x"), [], materialized=False, fence=None)  # type: ignore[arg-type]
        for settings in await backend.connection_settings():
            assert settings["query_only"] == 1
    assert tree_snapshot(tmp_path) == before


async def test_a_read_only_open_never_initialises_an_empty_database(tmp_path: Path) -> None:
    """A SQLite database without the store's schema is refused read-only and left without tables."""
    path = tmp_path / "sessions.sqlite3"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA user_version=0")
    connection.execute("CREATE TABLE scratch (x)")
    connection.execute("DROP TABLE scratch")
    connection.commit()
    connection.close()
    path.chmod(0o600)
    before = tree_snapshot(tmp_path)
    backend = SqliteBackend(path, read_only=True)
    with pytest.raises(StoreMisconfiguredError, match="holds no dsh session store"):
        await backend.open()
    await backend.close()
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("read_only", [False, True])
async def test_an_id_with_a_lone_surrogate_is_simply_not_stored(tmp_path: Path, read_only: bool) -> None:
    """SQLite lookups of an id holding a lone surrogate answer "not stored" instead of a raw UnicodeEncodeError."""
    path = tmp_path / "sessions.sqlite3"
    await _sqlite_store(path)
    backend = SqliteBackend(path, read_only=read_only, busy_timeout_ms=50)
    async with running(backend) as (coordinator, _):
        assert await backend.exists(LONE_SURROGATE) is False
        assert await backend.load(LONE_SURROGATE) is None
        assert await backend.load_typed(LONE_SURROGATE, None, 0, frozenset()) is None
        assert await coordinator.revision(LONE_SURROGATE) is None
        with pytest.raises(SessionNotFoundError):
            await coordinator.inspect(LONE_SURROGATE)
        with pytest.raises(SessionNotFoundError):
            await coordinator.read_events(LONE_SURROGATE, types=["turn/end"])
        assert (await coordinator.list(parent_session=LONE_SURROGATE)).rows == []
