"""Storage for the projection cache: one whole record per session, replaced on every write.

Layer: projection. The cache is derived data, so storage is forgiving where the log is strict: a
record whose rows cannot be decoded is a miss (and the next write overwrites it), a single malformed
row is dropped, and a schema from another cache version is simply recreated. A file that belongs to
something else is refused (`PROJECTION_CACHE_UNAVAILABLE`) rather than touched. Rows are stored as
the exact `orjson` text (never JSONB-like normalisation), so a state holding `1e16` round-trips as a
float and key order survives.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar
from urllib.parse import quote

import orjson

from dsh.projection.errors import ProjectionError
from dsh.projection.unit import CheckpointRow
from dsh.session.header import SessionId

__all__ = [
    "CACHE_APPLICATION_ID",
    "CACHE_SCHEMA_VERSION",
    "CacheIdentity",
    "CacheRecord",
    "CacheStorage",
    "MemoryCacheStorage",
    "SqliteCacheStorage",
    "decode_rows",
    "encode_rows",
    "quick_check",
]

_log = logging.getLogger(__name__)

CACHE_APPLICATION_ID: Final = 0x44535043  # "DSPC"; the session database uses "DSPY"
CACHE_SCHEMA_VERSION: Final = 1

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CacheIdentity:
    """Which lifecycle a record describes: `createdAt`, `cwd` (None = absent) and the exact cut."""

    created_at: int
    cwd: str | None
    inherited_event_count: int


@dataclass(frozen=True, slots=True)
class CacheRecord:
    """One session's cached checkpoint rows (`key -> {ver, seq, val}`) under an identity.

    Two records are equal when their identities and rows are; `updated_at` (when it was written)
    takes no part. A record holds a dict, so it cannot be hashed.
    """

    identity: CacheIdentity
    rows: dict[str, CheckpointRow]
    updated_at: int = field(default=0, compare=False)


class CacheStorage(Protocol):
    """Where cache records live (memory, SQLite, PostgreSQL)."""

    async def get(self, session_id: SessionId) -> CacheRecord | None:
        """The record for `session_id`; None when absent or undecodable."""

    async def put(self, session_id: SessionId, record: CacheRecord) -> None:
        """Replace the record for `session_id` (upsert, last write wins)."""

    async def delete(self, session_id: SessionId) -> None:
        """Remove the record for `session_id` if present."""

    async def aclose(self) -> None:
        """Release resources; later calls fail."""


def encode_rows(rows: dict[str, CheckpointRow]) -> str:
    """The stored text of a record's rows."""
    return orjson.dumps(rows).decode()


def _valid_row(row: object) -> bool:
    if not isinstance(row, dict):
        return False
    ver, seq, val = row.get("ver"), row.get("seq"), row.get("val")
    return type(ver) is int and ver >= 0 and type(seq) is int and seq >= -1 and isinstance(val, dict) and len(row) == 3


class _Undecodable(ValueError):  # noqa: N818 - internal signal, never raised to callers
    pass


def decode_rows(text: str) -> dict[str, CheckpointRow]:
    """Parse stored rows; malformed rows are dropped. Raises `ValueError` when the text is not an object."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise _Undecodable(str(error)) from error
    if not isinstance(parsed, dict):
        raise _Undecodable("rows are not a JSON object")
    return {key: row for key, row in parsed.items() if _valid_row(row)}


class _WarnOnce:
    """Logs one warning per session id for undecodable records."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def warn(self, session_id: str, error: Exception) -> None:
        if session_id in self._seen:
            return
        self._seen.add(session_id)
        _log.warning(
            'session projection cache: record for "%s" cannot be decoded and is ignored until rewritten: %s',
            session_id,
            error,
        )


class MemoryCacheStorage:
    """In-process storage for tests and memory-only runtimes; reads do no I/O.

    Records are kept as their encoded text, so values round-trip exactly as on disk.
    """

    def __init__(self) -> None:
        self._records: dict[str, tuple[CacheIdentity, str, int]] = {}
        self._warn = _WarnOnce()
        self._closed = False
        self.gets = 0
        self.puts = 0

    def _check_open(self) -> None:
        if self._closed:
            raise _closed_error()

    async def get(self, session_id: SessionId) -> CacheRecord | None:
        """The record, decoded; None when absent or undecodable."""
        self._check_open()
        self.gets += 1
        stored = self._records.get(session_id)
        if stored is None:
            return None
        identity, text, updated_at = stored
        try:
            rows = decode_rows(text)
        except _Undecodable as error:
            self._warn.warn(session_id, error)
            return None
        return CacheRecord(identity, rows, updated_at)

    async def put(self, session_id: SessionId, record: CacheRecord) -> None:
        """Replace the record."""
        self._check_open()
        self.puts += 1
        self._records[session_id] = (record.identity, encode_rows(record.rows), record.updated_at)

    async def delete(self, session_id: SessionId) -> None:
        """Remove the record."""
        self._check_open()
        self._records.pop(session_id, None)

    async def put_raw(self, session_id: str, identity: CacheIdentity, rows_text: str) -> None:
        """Store arbitrary rows text (tests use it to poison a record)."""
        self._check_open()
        self._records[session_id] = (identity, rows_text, 0)

    async def aclose(self) -> None:
        """Refuse later calls, like the durable storages do (the records stay in this object)."""
        self._closed = True


_TABLE_SQL: Final = (
    "CREATE TABLE projection_cache ("
    " session_id TEXT PRIMARY KEY,"
    " created_at INTEGER NOT NULL,"
    " cwd TEXT,"
    " inherited_event_count INTEGER NOT NULL,"
    " rows TEXT NOT NULL,"
    " updated_at INTEGER NOT NULL) STRICT"
)


class SqliteCacheStorage:
    """The default storage: `$DSH_HOME/cache.sqlite3`, one STRICT table, WAL, one worker thread.

    Open with `await SqliteCacheStorage.open(path)`; it refuses a file that belongs to something else.
    `open(path, read_only=True)` opens an existing cache with `mode=ro` and creates nothing (no
    folder, file, table or journal-mode change); its writes are dropped, since the cache is derived
    data (docs/storage-format.md#projection-cache-file).
    """

    def __init__(
        self, path: Path, connection: sqlite3.Connection, executor: ThreadPoolExecutor, *, read_only: bool = False
    ) -> None:
        self.path = path
        self.read_only = read_only
        self._connection: sqlite3.Connection | None = connection
        self._executor = executor
        self._warn = _WarnOnce()

    @classmethod
    async def open(
        cls, path: Path | str, *, busy_timeout_ms: int = 5000, read_only: bool = False
    ) -> SqliteCacheStorage:
        """Open or create the cache file (read-only: open an existing one, create nothing).

        Raises:
            ProjectionError: `PROJECTION_CACHE_UNAVAILABLE` for a foreign or unusable file, and
                (read-only) for a missing file or a cache of another schema version.
        """
        target = Path(path)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsh-cache")
        loop = asyncio.get_running_loop()
        opener = _open_read_only if read_only else _open_connection
        try:
            connection = await loop.run_in_executor(executor, opener, target, busy_timeout_ms)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(target, connection, executor, read_only=read_only)

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._connection is None:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._connection, *args)
        except sqlite3.Error as error:
            raise ProjectionError(
                f"projection cache storage failed: {error}", code="PROJECTION_CACHE_STORAGE_FAILED"
            ) from error

    async def get(self, session_id: SessionId) -> CacheRecord | None:
        """One indexed read by primary key."""
        row = await self._run(_select, session_id)
        if row is None:
            return None
        created_at, cwd, cut, text, updated_at = row
        try:
            rows = decode_rows(text)
        except _Undecodable as error:
            self._warn.warn(session_id, error)
            return None
        return CacheRecord(CacheIdentity(created_at, cwd, cut), rows, updated_at)

    async def put(self, session_id: SessionId, record: CacheRecord) -> None:
        """Upsert the whole record (dropped when opened read-only)."""
        if self.read_only:
            return
        identity = record.identity
        await self._run(
            _upsert,
            (
                session_id,
                identity.created_at,
                identity.cwd,
                identity.inherited_event_count,
                encode_rows(record.rows),
                record.updated_at,
            ),
        )

    async def put_raw(self, session_id: str, identity: CacheIdentity, rows_text: str) -> None:
        """Store arbitrary rows text (tests use it to poison a record)."""
        await self._run(
            _upsert, (session_id, identity.created_at, identity.cwd, identity.inherited_event_count, rows_text, 0)
        )

    async def delete(self, session_id: SessionId) -> None:
        """Remove the record (nothing is removed when opened read-only)."""
        if self.read_only:
            return
        await self._run(_delete, session_id)

    async def aclose(self) -> None:
        """Close the connection on its thread and stop the worker."""
        connection, self._connection = self._connection, None
        if connection is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, connection.close)
        self._executor.shutdown(wait=True)


def _closed_error() -> ProjectionError:
    return ProjectionError("the projection cache storage is closed", code="PROJECTION_CACHE_STORAGE_FAILED")


def _unavailable(message: str) -> ProjectionError:
    return ProjectionError(message, code="PROJECTION_CACHE_UNAVAILABLE")


def _open_connection(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open with retries: switching to WAL and the first schema transaction can meet another
    process opening the same file at the same moment, and SQLite reports that as "locked" without
    always consulting the busy handler. Runs in the storage's worker thread, so waiting is fine."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    delay = 0.005
    while True:
        try:
            return _open_once(path, busy_timeout_ms)
        except ProjectionError as error:
            locked = isinstance(error.__cause__, sqlite3.OperationalError) and "locked" in str(error.__cause__)
            if not locked or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _open_once(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open, check ownership and schema, recreate the table for another cache version."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_symlink():
            raise _unavailable(f"projection cache {path} is a symlink; refusing to open it")
        if not path.exists():
            # Create the file with owner-only permissions before SQLite opens it.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        elif not stat.S_ISREG(path.stat().st_mode):
            raise _unavailable(f"projection cache {path} is not a regular file")
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except OSError as error:
        raise _unavailable(f"cannot open projection cache {path}: {error}") from error
    except sqlite3.Error as error:
        raise _unavailable(f"cannot open projection cache {path}: {error}") from error
    try:
        connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # Ownership first, read-only: a file that belongs to something else is refused untouched
        # (even switching its journal mode would rewrite its header). One read transaction, so the
        # application id and the table list come from the same snapshot even while another process
        # is creating the cache.
        connection.execute("BEGIN")
        try:
            _owned_tables(connection, path)
        finally:
            connection.execute("COMMIT")
        # WAL must be chosen outside any transaction; read it back to be sure it took.
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise _unavailable(f"projection cache {path} cannot use WAL (journal_mode={mode})")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Checked again under the write lock: another process may have created it meanwhile.
            _check_or_create(connection, path)
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
    except sqlite3.DatabaseError as error:
        connection.close()
        raise _unavailable(f"projection cache {path} is not a usable SQLite database: {error}") from error
    except BaseException:
        connection.close()
        raise
    return connection


def _open_read_only(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open an existing cache with `mode=ro`: check ownership and schema, change nothing.

    A cache of another schema version is refused (a writing open would rebuild it), so a read-only
    runtime simply runs without it.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise _unavailable(f"no projection cache at {path}") from None
    except OSError as error:
        raise _unavailable(f"cannot open projection cache {path}: {error}") from error
    if not stat.S_ISREG(info.st_mode):
        raise _unavailable(f"projection cache {path} is not a regular file")
    if info.st_size == 0:
        raise _unavailable(f"projection cache {path} is an empty file")
    try:
        connection = sqlite3.connect(
            f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as error:
        raise _unavailable(f"cannot open projection cache {path}: {error}") from error
    try:
        connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        connection.execute("PRAGMA query_only=ON")
        connection.execute("BEGIN")
        try:
            tables = _owned_tables(connection, path)
            version = connection.execute("PRAGMA user_version").fetchone()[0]
        finally:
            connection.execute("COMMIT")
        if tables is None or version != CACHE_SCHEMA_VERSION or tables.get("projection_cache") != _TABLE_SQL:
            raise _unavailable(f"projection cache {path} holds another cache schema; a writing open rebuilds it")
    except sqlite3.DatabaseError as error:
        connection.close()
        raise _unavailable(f"projection cache {path} is not a usable SQLite database: {error}") from error
    except BaseException:
        connection.close()
        raise
    return connection


def quick_check(path: Path) -> str:
    """`PRAGMA quick_check` of a SQLite file opened with `mode=ro` (blocking; changes nothing).

    Returns:
        `"ok"`, or SQLite's description of the first problems found.

    Raises:
        sqlite3.Error: The file cannot be opened or is not a database.
    """
    connection = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None)
    try:
        connection.execute("PRAGMA query_only=ON")
        rows = connection.execute("PRAGMA quick_check").fetchall()
    finally:
        connection.close()
    return "; ".join(str(row[0]) for row in rows)


def _owned_tables(connection: sqlite3.Connection, path: Path) -> dict[str, str | None] | None:
    """The cache's tables by name (`CREATE` text), or None for a fresh, empty database.

    Raises:
        ProjectionError: `PROJECTION_CACHE_UNAVAILABLE` when the database belongs to something else.
    """
    app_id = connection.execute("PRAGMA application_id").fetchone()[0]
    # SQLite's own bookkeeping tables (sqlite_sequence, sqlite_stat1 ...) belong to any database.
    tables: dict[str, str | None] = {
        name: sql
        for name, sql in connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        if not name.startswith("sqlite_")
    }
    if app_id == 0 and not tables:
        return None
    if app_id != CACHE_APPLICATION_ID:
        raise _unavailable(f"{path} belongs to another application (application_id {app_id:#x}); not a dsh cache")
    unknown = sorted(set(tables) - {"projection_cache"})
    if unknown:
        raise _unavailable(f"{path} holds unknown tables {unknown}; not a dsh cache")
    return tables


def _check_or_create(connection: sqlite3.Connection, path: Path) -> None:
    tables = _owned_tables(connection, path)
    if tables is None:
        _create(connection)
        return
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version != CACHE_SCHEMA_VERSION or tables.get("projection_cache") != _TABLE_SQL:
        # Derived data: another cache schema version (or a table of another shape) is dropped and
        # rebuilt, never migrated.
        connection.execute("DROP TABLE IF EXISTS projection_cache")
        _create(connection)


def _create(connection: sqlite3.Connection) -> None:
    connection.execute(_TABLE_SQL)
    connection.execute(f"PRAGMA application_id={CACHE_APPLICATION_ID}")
    connection.execute(f"PRAGMA user_version={CACHE_SCHEMA_VERSION}")


def _select(connection: sqlite3.Connection, session_id: str) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = connection.execute(
        "SELECT created_at, cwd, inherited_event_count, rows, updated_at FROM projection_cache WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    return row


def _upsert(connection: sqlite3.Connection, values: tuple[Any, ...]) -> None:
    connection.execute(
        "INSERT INTO projection_cache (session_id, created_at, cwd, inherited_event_count, rows, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET created_at = excluded.created_at, cwd = excluded.cwd,"
        " inherited_event_count = excluded.inherited_event_count, rows = excluded.rows,"
        " updated_at = excluded.updated_at",
        values,
    )


def _delete(connection: sqlite3.Connection, session_id: str) -> None:
    connection.execute("DELETE FROM projection_cache WHERE session_id = ?", (session_id,))
