"""Cache storage: the SQLite file's open rules and layout, and forgiving decoding on every storage.

The cache file is derived data: another cache schema version is recreated, a file that belongs to
something else is refused with `PROJECTION_CACHE_UNAVAILABLE` (and the runtime runs without a
cache), an undecodable record is a miss that the next write overwrites, and a single malformed row
is dropped. Every sqlite3 call runs on the storage's worker thread, never on the event loop. See
docs/storage-format.md#projection-cache-file.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

import dsh.projection.cache_storage as cache_storage
from dsh.config import Config
from dsh.persistence.memory import MemoryBackend
from dsh.persistence.sqlite import APPLICATION_ID as SESSION_DB_APPLICATION_ID
from dsh.persistence.sqlite import SqliteBackend
from dsh.projection import ProjectionError
from dsh.projection.cache_storage import (
    CACHE_APPLICATION_ID,
    CACHE_SCHEMA_VERSION,
    CacheIdentity,
    CacheRecord,
    SqliteCacheStorage,
)
from dsh.runtime import Runtime
from dsh.session import SessionId, SessionLogOffset
from dsh.testing.stored_logs import BASE_TIME_MS
from tests.projection.helpers import CacheStack, open_storage

STORAGE_LOGGER = "dsh.projection.cache_storage"
RECORD = CacheRecord(CacheIdentity(1, "/w", 0), {"counter": {"ver": 1, "seq": 2, "val": {"n": 1}}})


def _sql(path: Path, *statements: str) -> list[list[tuple]]:
    """Run statements on a private connection (test set-up and inspection only)."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        return [connection.execute(statement).fetchall() for statement in statements]
    finally:
        connection.close()


async def sql(path: Path, *statements: str) -> list[list[tuple]]:
    """`_sql` off the event loop."""
    return await asyncio.to_thread(_sql, path, *statements)


async def _refused(path: Path) -> ProjectionError:
    with pytest.raises(ProjectionError) as caught:
        await SqliteCacheStorage.open(path)
    assert caught.value.code == "PROJECTION_CACHE_UNAVAILABLE"
    return caught.value


async def test_the_file_is_owner_only_in_an_owner_only_folder(tmp_path: Path):
    """A new cache file is 0600 and the folder it creates is 0700."""
    path = tmp_path / "home" / "cache.sqlite3"
    storage = await SqliteCacheStorage.open(path)
    await storage.put(SessionId("s"), RECORD)
    await storage.aclose()

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_the_schema_is_strict_wal_and_owned_by_the_cache(tmp_path: Path):
    """STRICT `projection_cache` table, WAL, cache application id (not the session DB's), version 1."""
    path = tmp_path / "cache.sqlite3"
    storage = await SqliteCacheStorage.open(path)
    busy = await storage._run(lambda connection: connection.execute("PRAGMA busy_timeout").fetchone()[0])
    await storage.aclose()

    tables, mode, app_id, version = await sql(
        path,
        "SELECT name, sql FROM sqlite_master WHERE type = 'table'",
        "PRAGMA journal_mode",
        "PRAGMA application_id",
        "PRAGMA user_version",
    )
    assert [name for name, _ in tables] == ["projection_cache"]
    assert tables[0][1].endswith("STRICT")
    assert mode == [("wal",)]
    assert app_id == [(CACHE_APPLICATION_ID,)]
    assert CACHE_APPLICATION_ID != SESSION_DB_APPLICATION_ID
    assert version == [(CACHE_SCHEMA_VERSION,)]
    assert busy == 5000


async def test_records_survive_a_reopen_and_are_replaced_whole(tmp_path: Path):
    """One whole record per session, upserted: last write wins, and it persists across opens."""
    path = tmp_path / "cache.sqlite3"
    storage = await SqliteCacheStorage.open(path)
    await storage.put(SessionId("s"), RECORD)
    newer = CacheRecord(CacheIdentity(1, None, 0), {"hostonly": {"ver": 1, "seq": 5, "val": {"n": 6}}}, 77)
    await storage.put(SessionId("s"), newer)
    await storage.aclose()

    reopened = await SqliteCacheStorage.open(path)
    try:
        assert await reopened.get(SessionId("s")) == newer
        await reopened.delete(SessionId("s"))
        assert await reopened.get(SessionId("s")) is None
    finally:
        await reopened.aclose()


async def test_another_user_version_recreates_the_table_empty(tmp_path: Path):
    """A cache of another schema version is dropped and recreated empty, at version 1."""
    path = tmp_path / "cache.sqlite3"
    storage = await SqliteCacheStorage.open(path)
    await storage.put(SessionId("s"), RECORD)
    await storage.aclose()
    await sql(path, "PRAGMA user_version = 7")

    reopened = await SqliteCacheStorage.open(path)
    try:
        assert await reopened.get(SessionId("s")) is None
    finally:
        await reopened.aclose()
    assert (await sql(path, "PRAGMA user_version"))[0] == [(CACHE_SCHEMA_VERSION,)]


async def test_a_table_of_another_shape_is_recreated(tmp_path: Path):
    """Our application id and version but a table of another shape: derived data, rebuilt."""
    path = tmp_path / "cache.sqlite3"
    await sql(
        path,
        f"PRAGMA application_id = {CACHE_APPLICATION_ID}",
        f"PRAGMA user_version = {CACHE_SCHEMA_VERSION}",
        "CREATE TABLE projection_cache (session_id TEXT PRIMARY KEY, rows TEXT)",
    )

    storage = await SqliteCacheStorage.open(path)
    try:
        await storage.put(SessionId("s"), RECORD)
        assert await storage.get(SessionId("s")) == RECORD
    finally:
        await storage.aclose()


async def test_a_foreign_application_id_is_refused_untouched(tmp_path: Path):
    """A database of another application is refused with `PROJECTION_CACHE_UNAVAILABLE`, unchanged."""
    path = tmp_path / "cache.sqlite3"
    await sql(path, "PRAGMA application_id = 1234", "CREATE TABLE notes (body TEXT)")
    before = path.read_bytes()

    error = await _refused(path)

    assert "another application" in error.message
    assert path.read_bytes() == before


async def test_the_session_database_is_refused(tmp_path: Path):
    """The session database (its own application id) is never mistaken for a cache."""
    path = tmp_path / "sessions.sqlite3"
    backend = SqliteBackend(path)
    await backend.open()
    await backend.close()

    await _refused(path)


@pytest.mark.parametrize(
    "setup",
    [
        (f"PRAGMA application_id = {CACHE_APPLICATION_ID}", "CREATE TABLE intruder (x INTEGER)"),
        ("CREATE TABLE projection_cache (session_id TEXT)",),
    ],
    ids=["unknown-table", "no-application-id"],
)
async def test_unknown_tables_are_refused(tmp_path: Path, setup: tuple[str, ...]):
    """Tables the cache does not know (or a table without the cache's application id) are refused."""
    path = tmp_path / "cache.sqlite3"
    await sql(path, *setup)

    await _refused(path)


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path):
    """Garbage bytes are not a usable cache: refused, never overwritten."""
    path = tmp_path / "cache.sqlite3"
    path.write_bytes(b"definitely not sqlite" * 100)

    await _refused(path)
    assert path.read_bytes() == b"definitely not sqlite" * 100


async def test_a_symlink_is_refused(tmp_path: Path):
    """The cache file must be a regular file of its own, not a symlink."""
    target = tmp_path / "elsewhere.sqlite3"
    target.write_bytes(b"")
    link = tmp_path / "cache.sqlite3"
    link.symlink_to(target)

    await _refused(link)


async def test_the_runtime_runs_without_a_refused_cache(tmp_path: Path, caplog):
    """`Runtime.open` logs one warning and continues without a cache when the file is foreign."""
    await sql(tmp_path / "cache.sqlite3", "PRAGMA application_id = 1234", "CREATE TABLE t (x)")

    with caplog.at_level(logging.WARNING, logger="dsh.runtime"):
        async with Runtime.open(Config(home=tmp_path), backend=MemoryBackend()) as runtime:
            assert runtime.cache is None
            assert runtime.services.projection_cache is None

    warnings = [r for r in caplog.records if r.name == "dsh.runtime" and "projection cache unavailable" in r.message]
    assert len(warnings) == 1


async def test_undecodable_rows_are_a_miss_warned_once_and_refolded(stack: CacheStack, counter, emit, caplog):
    """Non-JSON rows: `cached_snapshot` misses (one warning per id); `cold_snapshot` overwrites them."""
    stack.register(counter)
    await stack.store_log("c", lambda session: (emit.user(session), emit.user(session)))
    await stack.put_raw("c", '{"counter": {"ver": 1, "seq": 0, "val": {"n": 1}')
    header = (await stack.coordinator.read_events("c")).header

    with caplog.at_level(logging.WARNING, logger=STORAGE_LOGGER):
        assert await stack.cache.cached_snapshot(header, SessionLogOffset(0)) is None
        assert await stack.cache.cached_snapshot(header, SessionLogOffset(0)) is None
    assert len([m for m in caplog.messages if 'record for "c" cannot be decoded' in m]) == 1

    snapshot = await stack.cache.cold_snapshot(SessionId("c"))
    assert snapshot.get("counter") == {"n": 2}
    assert stack.persistence.reads_of("c") == [0]
    served = await stack.cache.cached_snapshot(header, SessionLogOffset(0))
    assert served is not None
    assert served.get("counter") == {"n": 2}


async def test_the_next_policy_write_overwrites_an_undecodable_record(stack: CacheStack, counter, emit, caplog):
    """A poisoned record of a live session is replaced by its next write."""
    stack.register(counter)
    session = stack.store.create("s")
    await stack.put_raw("s", "not json at all", created_at=session.header.created_at)
    emit.user(session)
    emit.user(session)
    with caplog.at_level(logging.ERROR, logger=STORAGE_LOGGER):
        end = emit.turn_end(session)  # the third dirty event: a count write
        await stack.settle()

    served = await stack.cache.cached_snapshot(session.header, SessionLogOffset(0))
    assert served is not None
    assert served.as_of_seq == end.seq


@pytest.mark.parametrize("text", ["[]", '"rows"', "null"])
async def test_rows_that_are_not_an_object_are_a_miss(stack: CacheStack, counter, text: str, caplog):
    """JSON rows that are not an object are undecodable as a record: a miss."""
    stack.register(counter)
    await stack.put_raw("c", text, created_at=1)

    with caplog.at_level(logging.ERROR, logger=STORAGE_LOGGER):
        assert await stack.storage.get(SessionId("c")) is None


async def test_a_single_malformed_row_is_dropped_and_the_others_kept(stack: CacheStack, counter, hostonly, nullish):
    """Inside a decodable record, malformed rows are dropped; the valid row is still served."""
    stack.register(counter, hostonly, nullish)
    await stack.put_raw(
        "c",
        '{"counter": {"ver": 1, "seq": 4, "val": {"n": 2}},'
        ' "hostonly": {"ver": 1, "seq": "4", "val": {"n": 2}},'
        ' "nullish": [1, 2],'
        ' "extra": {"ver": 1, "seq": 4, "val": {}, "junk": true}}',
        created_at=BASE_TIME_MS,
    )

    record = await stack.storage.get(SessionId("c"))

    assert record is not None
    assert record.rows == {"counter": {"ver": 1, "seq": 4, "val": {"n": 2}}}


async def test_sqlite_calls_never_run_on_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Open, reads, writes, deletes and close run every sqlite3 call on the worker thread."""
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    real_connect = sqlite3.connect

    def traced_connect(*args, **kwargs):
        threads.add(threading.get_ident())
        connection = real_connect(*args, **kwargs)
        connection.set_trace_callback(lambda statement: threads.add(threading.get_ident()))
        return connection

    monkeypatch.setattr(cache_storage.sqlite3, "connect", traced_connect)
    storage = await SqliteCacheStorage.open(tmp_path / "cache.sqlite3")
    await storage.put(SessionId("s"), RECORD)
    assert await storage.get(SessionId("s")) == RECORD
    await storage.delete(SessionId("s"))
    await storage.aclose()

    assert threads
    assert loop_thread not in threads


async def test_a_closed_storage_refuses_with_storage_failed(storage_kind: str, tmp_path: Path):
    """After `aclose` every storage refuses reads and writes with `PROJECTION_CACHE_STORAGE_FAILED`."""
    storage = await open_storage(storage_kind, tmp_path / "cache.sqlite3")
    await storage.aclose()

    for call in (storage.get(SessionId("s")), storage.put(SessionId("s"), RECORD), storage.delete(SessionId("s"))):
        with pytest.raises(ProjectionError) as caught:
            await call
        assert caught.value.code == "PROJECTION_CACHE_STORAGE_FAILED"


async def test_two_storages_share_one_file(tmp_path: Path):
    """Two opens of one file (two processes) see each other's records."""
    path = tmp_path / "cache.sqlite3"
    first, second = await asyncio.gather(SqliteCacheStorage.open(path), SqliteCacheStorage.open(path))
    try:
        await first.put(SessionId("s"), RECORD)
        assert await second.get(SessionId("s")) == RECORD
    finally:
        await first.aclose()
        await second.aclose()
