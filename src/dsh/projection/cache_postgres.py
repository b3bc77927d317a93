"""PostgreSQL storage for the projection cache, on the session store's own connection pool.

Layer: projection (beside `cache_storage`, whose record types and codecs it uses). When sessions live
in PostgreSQL, the cache lives there too: table `projection_cache` in the store's schema
(docs/storage-format.md#postgresql-projection-cache), created by the store's migrations, so several
hosts share it. Every call is one statement run through `PostgresBackend.run`, which borrows a pooled
connection, retries on a broken one and translates driver errors; this module turns those into
`PROJECTION_CACHE_STORAGE_FAILED`. `rows` is `text` holding the exact `orjson` text, never `jsonb`
(which would respell numbers and reorder keys). The driver itself is never imported here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from dsh.persistence.errors import SessionPersistenceError
from dsh.persistence.postgres import PostgresBackend, quoted
from dsh.projection.cache_storage import CacheIdentity, CacheRecord, decode_rows, encode_rows
from dsh.projection.errors import ProjectionError
from dsh.session.header import SessionId

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["PostgresCacheStorage"]

_T = TypeVar("_T")

_log = logging.getLogger("dsh.projection.cache_storage")

_COLUMNS: Final = {
    "session_id": "text",
    "created_at": "bigint",
    "cwd": "text",
    "inherited_event_count": "bigint",
    "rows": "text",
    "updated_at": "bigint",
}
"""The table's columns and types, as `information_schema.columns` reports them."""

# Statement templates; `{s}` is the quoted schema name.
_SELECT: Final = (
    "SELECT created_at, cwd, inherited_event_count, rows, updated_at FROM {s}.projection_cache WHERE session_id = %s"
)
_UPSERT: Final = (
    "INSERT INTO {s}.projection_cache (session_id, created_at, cwd, inherited_event_count, rows, updated_at) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET created_at = excluded.created_at, "
    "cwd = excluded.cwd, inherited_event_count = excluded.inherited_event_count, rows = excluded.rows, "
    "updated_at = excluded.updated_at"
)
_DELETE: Final = "DELETE FROM {s}.projection_cache WHERE session_id = %s"
_SHAPE: Final = (
    "SELECT column_name, data_type FROM information_schema.columns "
    "WHERE table_schema = %s AND table_name = 'projection_cache'"
)
_RECREATE: Final = (
    "DROP TABLE IF EXISTS {s}.projection_cache",
    "CREATE TABLE {s}.projection_cache (session_id text PRIMARY KEY, created_at bigint NOT NULL, "
    "cwd text, inherited_event_count bigint NOT NULL, rows text NOT NULL, updated_at bigint NOT NULL)",
)


def _unavailable(message: str) -> ProjectionError:
    return ProjectionError(message, code="PROJECTION_CACHE_UNAVAILABLE")


class PostgresCacheStorage:
    """Cache records in the PostgreSQL store's schema. Open with `await PostgresCacheStorage.open(backend)`.

    `open(backend, read_only=True)` uses an existing table and changes nothing: its writes are
    dropped, since the cache is derived data. The storage never closes the backend's pool: the
    runtime closes the cache first and persistence later.
    """

    def __init__(self, backend: PostgresBackend, *, read_only: bool = False) -> None:
        self.backend = backend
        self.read_only = read_only
        self._s = quoted(backend.schema)
        self._closed = False
        self._warned: set[str] = set()

    @classmethod
    async def open(cls, backend: PostgresBackend, *, read_only: bool = False) -> PostgresCacheStorage:
        """Check the cache table of an opened backend (a writing open rebuilds one of another shape).

        Raises:
            ProjectionError: `PROJECTION_CACHE_UNAVAILABLE` when the table is missing or of another
                shape on a read-only open, or the database cannot be reached.
        """
        storage = cls(backend, read_only=read_only)
        schema = backend.schema

        async def check(conn: AsyncConnection[Any]) -> None:
            rows = await (await conn.execute(_SHAPE, (schema,))).fetchall()
            if {str(name): str(kind) for name, kind in rows} == _COLUMNS:
                return
            if read_only:
                what = "has no projection_cache table" if not rows else "holds a projection_cache of another shape"
                raise _unavailable(f'PostgreSQL schema "{schema}" {what}; a writing open creates it')
            # Derived data: a table of another shape is rebuilt, never migrated.
            async with conn.transaction():
                for statement in _RECREATE:
                    await conn.execute(statement.replace("{s}", storage._s))

        try:
            await backend.run(check, "check the projection cache table")
        except SessionPersistenceError as error:
            raise _unavailable(f"projection cache unavailable: {error.message}") from error
        return storage

    async def _run(self, work: Callable[[AsyncConnection[Any]], Awaitable[_T]], what: str) -> _T:
        if self._closed:
            raise ProjectionError("the projection cache storage is closed", code="PROJECTION_CACHE_STORAGE_FAILED")
        try:
            return await self.backend.run(work, what)
        except SessionPersistenceError as error:
            raise ProjectionError(
                f"projection cache storage failed: {error.message}", code="PROJECTION_CACHE_STORAGE_FAILED"
            ) from error

    async def get(self, session_id: SessionId) -> CacheRecord | None:
        """One read by primary key; None when absent or undecodable (warned once per id)."""

        async def work(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = await (
                await conn.execute(_SELECT.replace("{s}", self._s), (session_id,))
            ).fetchone()
            return row

        row = await self._run(work, "read a projection cache record")
        if row is None:
            return None
        created_at, cwd, cut, text, updated_at = row
        try:
            rows = decode_rows(text)
        except ValueError as error:
            if session_id not in self._warned:
                self._warned.add(session_id)
                _log.warning(
                    'session projection cache: record for "%s" cannot be decoded and is ignored until rewritten: %s',
                    session_id,
                    error,
                )
            return None
        return CacheRecord(CacheIdentity(int(created_at), cwd, int(cut)), rows, int(updated_at))

    async def put(self, session_id: SessionId, record: CacheRecord) -> None:
        """Upsert the whole record (dropped when opened read-only)."""
        if self.read_only:
            return
        identity = record.identity
        await self._upsert(session_id, identity, encode_rows(record.rows), record.updated_at)

    async def put_raw(self, session_id: str, identity: CacheIdentity, rows_text: str) -> None:
        """Store arbitrary rows text (tests use it to poison a record)."""
        await self._upsert(session_id, identity, rows_text, 0)

    async def _upsert(self, session_id: str, identity: CacheIdentity, text: str, updated_at: int) -> None:
        values = (session_id, identity.created_at, identity.cwd, identity.inherited_event_count, text, updated_at)

        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute(_UPSERT.replace("{s}", self._s), values)

        await self._run(work, "write a projection cache record")

    async def delete(self, session_id: SessionId) -> None:
        """Remove the record (nothing is removed when opened read-only)."""
        if self.read_only:
            return

        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute(_DELETE.replace("{s}", self._s), (session_id,))

        await self._run(work, "delete a projection cache record")

    async def aclose(self) -> None:
        """Refuse later calls (the pool belongs to the session store's backend)."""
        self._closed = True
