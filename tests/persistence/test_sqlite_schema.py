"""SQLite backend: schema, connection pragmas, open checks and location safety.

A store file is adopted only when it is exactly ours; anything else is refused untouched
(docs/storage-format.md#sqlite-schema, docs/storage-format.md#sqlite-pragmas).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dsh.errors import ConfigError
from dsh.json import FrozenDict, freeze
from dsh.persistence.errors import PersistenceClosedError, StoreFormatUnsupportedError, StoreMisconfiguredError
from dsh.persistence.sqlite import APPLICATION_ID, USER_VERSION, SqliteBackend
from dsh.session.events import make_event
from tests.persistence.helpers import raw_sql

pytestmark = pytest.mark.usefixtures("strict_sqlite_guard")


def header(session_id: str = "s1") -> FrozenDict:
    """A minimal stored header record."""
    return FrozenDict({"type": "session", "version": 0, "id": session_id, "createdAt": 1000, "delegationDepth": 0})


async def store_one(backend: SqliteBackend, session_id: str = "s1") -> None:
    """Materialize one session with a single event."""
    event = make_event("turn/start", 0, 5, freeze({"turn": 0}))
    await backend.append_batch(header(session_id), [event], materialized=False, fence=None)


async def test_new_file_reads_back_identity_strict_tables_and_pragmas(tmp_path: Path) -> None:
    """A new file gets the application id, user version, STRICT tables, both indexes, WAL and FULL sync."""
    path = tmp_path / "sessions.sqlite3"
    async with SqliteBackend(path) as backend:
        settings = await backend.connection_settings()

        def inspect(conn: sqlite3.Connection) -> dict[str, Any]:
            return {
                "application_id": conn.execute("PRAGMA application_id").fetchone()[0],
                "user_version": conn.execute("PRAGMA user_version").fetchone()[0],
                "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
                "strict": {row[1]: row[5] for row in conn.execute("PRAGMA table_list") if row[0] == "main"},
                "indexes": sorted(
                    row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index'")
                ),
                "store": conn.execute("SELECT singleton, store_id FROM store").fetchall(),
            }

        found = await raw_sql(path, inspect)
    assert found["application_id"] == APPLICATION_ID == 0x44535059
    assert found["user_version"] == USER_VERSION == 1
    assert found["journal_mode"] == "wal"
    assert found["strict"]["store"] == found["strict"]["sessions"] == found["strict"]["events"] == 1
    assert {"events_by_type", "sessions_by_parent"} <= set(found["indexes"])
    [(singleton, store_id)] = found["store"]
    assert singleton == 1
    assert len(store_id) == 36
    assert len(settings) == 3  # the writer and two readers
    for conn_settings in settings:
        assert conn_settings["journal_mode"] == "wal"
        assert conn_settings["synchronous"] == 2  # FULL
        assert conn_settings["foreign_keys"] == 1
        assert conn_settings["busy_timeout"] == 5000
        assert conn_settings["trusted_schema"] == 0
    assert [s["query_only"] for s in settings] == [0, 1, 1]


async def test_upstream_dshp_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """An upstream-style database (application id "DSHP", its own schema) is STORE_FORMAT_UNSUPPORTED."""
    path = tmp_path / "upstream.sqlite3"

    def build(conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA application_id={int.from_bytes(b'DSHP', 'big')}")
        conn.execute("PRAGMA user_version=17")
        conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, header TEXT)")

    await raw_sql(path, build)
    os.chmod(path, 0o600)
    with pytest.raises(StoreFormatUnsupportedError) as caught:
        await SqliteBackend(path).open()
    assert caught.value.code == "STORE_FORMAT_UNSUPPORTED"
    assert "DSHP" in caught.value.message
    tables = await raw_sql(path, lambda conn: conn.execute("SELECT name FROM sqlite_schema").fetchall())
    assert tables == [("sessions",), ("sqlite_autoindex_sessions_1",)]


@pytest.mark.parametrize("version", [0, 2, 17])
async def test_unknown_user_version_is_refused(tmp_path: Path, version: int) -> None:
    """A store with our application id but another user_version is STORE_FORMAT_UNSUPPORTED."""
    path = tmp_path / "sessions.sqlite3"
    async with SqliteBackend(path):
        pass
    await raw_sql(path, lambda conn: conn.execute(f"PRAGMA user_version={version}"))
    with pytest.raises(StoreFormatUnsupportedError) as caught:
        await SqliteBackend(path).open()
    assert caught.value.code == "STORE_FORMAT_UNSUPPORTED"
    assert caught.value.location == str(path)


async def test_database_without_application_id_but_with_tables_is_refused(tmp_path: Path) -> None:
    """A non-empty database of another program (application id 0) is never adopted."""
    path = tmp_path / "other.sqlite3"
    await raw_sql(path, lambda conn: conn.execute("CREATE TABLE notes (body TEXT)"))
    os.chmod(path, 0o600)
    with pytest.raises(StoreFormatUnsupportedError):
        await SqliteBackend(path).open()


@pytest.mark.parametrize(
    "drift",
    [
        "CREATE INDEX extra ON events(time)",
        "DROP INDEX events_by_type",
        "DROP INDEX sessions_by_parent",
        "ALTER TABLE sessions ADD COLUMN note TEXT",
    ],
)
async def test_schema_objects_differing_from_the_reference_are_refused(tmp_path: Path, drift: str) -> None:
    """Schema objects that differ from the in-memory reference schema are STORE_FORMAT_UNSUPPORTED."""
    path = tmp_path / "sessions.sqlite3"
    async with SqliteBackend(path):
        pass
    await raw_sql(path, lambda conn: conn.execute(drift))
    with pytest.raises(StoreFormatUnsupportedError):
        await SqliteBackend(path).open()


async def test_reopen_keeps_the_store_id_and_data(tmp_path: Path) -> None:
    """Reopening a store keeps its identity (revisions stay equal) and its sessions."""
    path = tmp_path / "sessions.sqlite3"
    async with SqliteBackend(path) as first:
        await store_one(first)
        before = await first.read_revision("s1")
    async with SqliteBackend(path) as second:
        assert await second.read_revision("s1") == before
        log = await second.load("s1")
    assert log is not None
    assert [event["type"] for event in log.events] == ["turn/start"]


async def test_two_instances_opening_one_new_file_initialise_it_once(tmp_path: Path) -> None:
    """Concurrent opens of one pristine file serialize on BEGIN IMMEDIATE and share one store id."""
    path = tmp_path / "sessions.sqlite3"
    first, second = SqliteBackend(path), SqliteBackend(path)
    await asyncio.gather(first.open(), second.open())
    try:
        await store_one(first)
        assert await first.read_revision("s1") == await second.read_revision("s1")
        rows = await raw_sql(path, lambda conn: conn.execute("SELECT count(*) FROM store").fetchone())
        assert rows == (1,)
    finally:
        await first.close()
        await second.close()


async def test_memory_database_uses_memory_journal_and_works() -> None:
    """`:memory:` reads back journal_mode `memory`, uses one connection, and stores and loads sessions."""
    async with SqliteBackend(":memory:") as backend:
        settings = await backend.connection_settings()
        await store_one(backend)
        log = await backend.load("s1")
        assert await backend.acquire("s1") is None
        await backend.release("s1")
    assert [s["journal_mode"] for s in settings] == ["memory"]
    assert log is not None
    assert len(log.events) == 1
    assert not Path(":memory:.locks").exists()


async def test_new_database_file_is_created_0600_in_a_new_0700_directory(tmp_path: Path) -> None:
    """A missing directory is created 0700 and a new database file 0600, whatever the umask."""
    path = tmp_path / "home" / "sessions.sqlite3"
    old = os.umask(0)
    try:
        async with SqliteBackend(path) as backend:
            await store_one(backend)
    finally:
        os.umask(old)
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    assert (path.stat().st_mode & 0o777) == 0o600
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        assert (wal.stat().st_mode & 0o077) == 0


async def test_symlinked_database_is_misconfigured(tmp_path: Path) -> None:
    """A database path that is a symbolic link is refused as STORE_MISCONFIGURED."""
    target = tmp_path / "real.sqlite3"
    async with SqliteBackend(target):
        pass
    link = tmp_path / "link.sqlite3"
    link.symlink_to(target)
    with pytest.raises(StoreMisconfiguredError) as caught:
        await SqliteBackend(link).open()
    assert caught.value.code == "STORE_MISCONFIGURED"


async def test_database_readable_by_others_is_misconfigured(tmp_path: Path) -> None:
    """An existing database file with group or other permission bits is refused."""
    path = tmp_path / "sessions.sqlite3"
    async with SqliteBackend(path):
        pass
    path.chmod(0o644)
    with pytest.raises(StoreMisconfiguredError):
        await SqliteBackend(path).open()


async def test_directory_writable_by_others_is_misconfigured(tmp_path: Path) -> None:
    """A database directory others can write is refused (they could swap the file or its WAL)."""
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o775)
    folder.chmod(0o775)
    with pytest.raises(StoreMisconfiguredError):
        await SqliteBackend(folder / "sessions.sqlite3").open()
    assert not (folder / "sessions.sqlite3").exists()


async def test_directory_readable_by_others_is_accepted(tmp_path: Path) -> None:
    """A 0755 directory (an ordinary home folder) is accepted; the database file itself is 0600."""
    folder = tmp_path / "home"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    backend = SqliteBackend(folder / "sessions.sqlite3")
    await backend.open()
    await backend.close()
    assert (folder / "sessions.sqlite3").stat().st_mode & 0o777 == 0o600


async def test_database_path_that_is_a_directory_is_misconfigured(tmp_path: Path) -> None:
    """A directory where the database file should be is refused, not opened."""
    path = tmp_path / "sessions.sqlite3"
    path.mkdir(mode=0o700)
    with pytest.raises(StoreMisconfiguredError):
        await SqliteBackend(path).open()


@pytest.mark.parametrize("value", [True, -1, "5", 2**31, 1.5])
def test_invalid_busy_timeout_is_a_config_error(value: object) -> None:
    """`busy_timeout_ms` must be an integer in 0..2147483647 (CONFIG_INVALID)."""
    with pytest.raises(ConfigError) as caught:
        SqliteBackend(":memory:", busy_timeout_ms=value)  # type: ignore[arg-type]
    assert caught.value.code == "CONFIG_INVALID"


async def test_calls_before_open_and_after_close_raise_persistence_closed(tmp_path: Path) -> None:
    """Every operation before `open` or after `close` raises PERSISTENCE_CLOSED; `close` is idempotent."""
    backend = SqliteBackend(tmp_path / "sessions.sqlite3")
    with pytest.raises(PersistenceClosedError):
        await backend.load("s1")
    await backend.open()
    await backend.open()  # a second open is a no-op
    await backend.close()
    await backend.close()
    for call in (
        backend.load("s1"),
        backend.list_headers(),
        backend.read_revision("s1"),
        backend.exists("s1"),
        backend.acquire("s1"),
        backend.append_batch(header(), [], materialized=False, fence=None),
    ):
        with pytest.raises(PersistenceClosedError):
            await call
    with pytest.raises(PersistenceClosedError):
        await backend.open()


async def test_failed_open_can_be_retried_after_fixing_the_cause(tmp_path: Path) -> None:
    """A refused open leaves no threads or state behind, and a later open succeeds once the cause is gone."""
    path = tmp_path / "sessions.sqlite3"
    async with SqliteBackend(path):
        pass
    path.chmod(0o640)
    backend = SqliteBackend(path)
    with pytest.raises(StoreMisconfiguredError):
        await backend.open()
    path.chmod(0o600)
    await backend.open()
    await backend.close()
