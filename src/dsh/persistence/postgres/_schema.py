"""The PostgreSQL store's schema: ordered migrations, the guarded open, and the checks of a read-only open.

Layer: persistence (private to `dsh.persistence.postgres`). Every table lives in one schema whose
name comes from the configuration (default `dsh`), spliced into the SQL as a quoted identifier after
`check_schema_name` accepted it. The logical tables are the SQLite store's
(docs/storage-format.md#postgresql-schema), with `bigint` integers and `text` JSON columns holding
the exact `orjson` text: never `jsonb`, which reorders keys, drops duplicates and respells numbers.

Migrations are an ordered list applied by a *writing* open inside one transaction that first takes
`pg_advisory_xact_lock` on a key derived from the schema name, so hosts starting together migrate
exactly once: the second waits for the first's commit, then finds the schema current. A read-only
open never creates or alters anything: a missing or empty schema is an empty store, an older schema
is refused with the command that migrates it, a newer one with "upgrade dsh".
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from dsh.persistence.errors import StoreFormatUnsupportedError
from dsh.persistence.postgres._driver import Driver, first_line, quoted

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "TABLES", "StoreInfo", "migrate_store", "read_store"]

_LOCK_CLASS: Final = 0x44535059
"""First half of the advisory lock key: the ASCII bytes "DSPY" (the SQLite store's application id)."""

TABLES: Final = frozenset({"store", "sessions", "events", "session_leases", "projection_cache", "session_requests"})
"""The tables a current store holds."""

MIGRATIONS: Final[tuple[tuple[int, tuple[str, ...]], ...]] = (
    (
        1,
        (
            "CREATE TABLE {s}.store (singleton integer PRIMARY KEY CHECK (singleton = 1), "
            "store_id uuid NOT NULL, schema_version integer NOT NULL)",
            "CREATE TABLE {s}.sessions ("
            "id text PRIMARY KEY, version bigint NOT NULL, created_at bigint NOT NULL, "
            "cwd text, parent_session text, seed_length bigint NOT NULL DEFAULT 0, "
            "origin text CHECK (origin IS NULL OR origin = 'subagent'), "
            "delegation_depth bigint NOT NULL DEFAULT 0, agent_preset text, "
            "incarnation text NOT NULL, revision bigint NOT NULL, next_seq bigint NOT NULL)",
            "CREATE TABLE {s}.events ("
            "session_id text NOT NULL REFERENCES {s}.sessions(id) ON DELETE CASCADE, "
            "seq bigint NOT NULL, type text NOT NULL, time bigint NOT NULL, "
            "data text NOT NULL, source_event_seqs text, surface_op text, "
            "ignorable smallint CHECK (ignorable IS NULL OR ignorable = 1), "
            "PRIMARY KEY (session_id, seq))",
            "CREATE INDEX sessions_by_parent ON {s}.sessions (parent_session, created_at, id) "
            "WHERE parent_session IS NOT NULL",
            "CREATE INDEX events_by_type ON {s}.events (session_id, type, seq)",
            "CREATE TABLE {s}.session_leases (session_id text PRIMARY KEY, holder text NOT NULL, "
            "generation bigint NOT NULL, expires_at timestamptz NOT NULL)",
            # The projection cache is derived data sharing the store's pool; a new cache layout is
            # a migration that drops and recreates this table.
            "CREATE TABLE {s}.projection_cache (session_id text PRIMARY KEY, created_at bigint NOT NULL, "
            "cwd text, inherited_event_count bigint NOT NULL, rows text NOT NULL, updated_at bigint NOT NULL)",
        ),
    ),
    (
        2,
        (
            # Work sent to a `dsh serve` replica that does not hold the session's lease
            # (docs/server.md#replicas): a durable row the holder is woken for. The session rows are
            # unchanged, so every reader of the stored sessions reads them as before.
            "CREATE TABLE {s}.session_requests (id bigserial PRIMARY KEY, session_id text, "
            "kind text NOT NULL CHECK (kind IN ('prompt', 'interrupt', 'approval')), body text NOT NULL, "
            "sender text NOT NULL, "
            "state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'accepted', 'done')), "
            "handler text, answer text, created_at timestamptz NOT NULL DEFAULT now(), "
            "updated_at timestamptz NOT NULL DEFAULT now())",
            "CREATE INDEX session_requests_open ON {s}.session_requests (session_id, id) WHERE state <> 'done'",
        ),
    ),
)
"""`(version, statements)` in the order they apply; `{s}` is the quoted schema name."""

SCHEMA_VERSION: Final = MIGRATIONS[-1][0]
"""The schema version this build reads and writes."""

_STORE_ROW: Final = "SELECT store_id::text, schema_version FROM {s}.store WHERE singleton = 1"
_INSERT_STORE: Final = "INSERT INTO {s}.store (singleton, store_id, schema_version) VALUES (1, %s, %s)"
_SET_VERSION: Final = "UPDATE {s}.store SET schema_version = %s WHERE singleton = 1"


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """What the `store` row says: the store's identity (part of every revision) and its schema version."""

    store_id: str
    schema_version: int


def _lock_key(schema: str) -> int:
    """Second half of the advisory lock key: a signed 32-bit hash of the schema name."""
    value = zlib.crc32(schema.encode())
    return value - (1 << 32) if value >= 1 << 31 else value


async def _tables(conn: AsyncConnection[Any], schema: str) -> set[str] | None:
    """The relations in `schema`, or None when the schema does not exist."""
    found = await (await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))).fetchone()
    if found is None:
        return None
    rows = await (
        await conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (schema,),
        )
    ).fetchall()
    return {str(row[0]) for row in rows}


def _foreign(schema: str, location: str, detail: str) -> StoreFormatUnsupportedError:
    return StoreFormatUnsupportedError(
        f'PostgreSQL schema "{schema}" at {location} is not a dsh session store ({detail}); choose another '
        "schema with DSH_PG_SCHEMA",
        location=location,
    )


async def _store_row(driver: Driver, conn: AsyncConnection[Any], schema: str, location: str) -> StoreInfo:
    try:
        async with conn.transaction():  # a savepoint when called inside a transaction
            cursor = await conn.execute(_STORE_ROW.replace("{s}", quoted(schema)))
            row = await cursor.fetchone()
    except (driver.psycopg.ProgrammingError, driver.psycopg.DataError) as error:
        # A `store` table of another shape: some other application's table of that name.
        raise _foreign(schema, location, f"its store table cannot be read: {first_line(error)}") from error
    if row is None:
        raise _foreign(schema, location, "its store table has no identity row")
    return StoreInfo(store_id=str(row[0]), schema_version=int(row[1]))


def _check_version(info: StoreInfo, schema: str, location: str, *, read_only: bool) -> None:
    version = info.schema_version
    if version > SCHEMA_VERSION:
        raise StoreFormatUnsupportedError(
            f'PostgreSQL store "{schema}" at {location} has schema version {version}, this build supports '
            f"{SCHEMA_VERSION}: the store is newer than this build (upgrade dsh to open it)",
            location=location,
        )
    if version < 1:
        raise _foreign(schema, location, f"schema version {version}")
    if version < SCHEMA_VERSION and read_only:
        raise StoreFormatUnsupportedError(
            f'PostgreSQL store "{schema}" at {location} has schema version {version}, this build reads '
            f"{SCHEMA_VERSION}; a read-only command does not migrate it: run a writing command (such as "
            "`dsh run`) once to migrate the store",
            location=location,
        )


def _check_tables(tables: set[str], schema: str, location: str) -> None:
    missing = sorted(TABLES - tables)
    if missing:
        raise _foreign(schema, location, f"tables {missing} are missing")


async def read_store(driver: Driver, conn: AsyncConnection[Any], schema: str, location: str) -> StoreInfo | None:
    """Check the store without changing anything (read-only opens); None when no store exists yet.

    A missing schema, or one without any relation, is an empty store: nothing was written there.

    Raises:
        StoreFormatUnsupportedError: A foreign schema, or a schema version other than this build's.
    """
    tables = await _tables(conn, schema)
    if not tables:
        return None
    if "store" not in tables:
        raise _foreign(schema, location, "it has tables but no store table")
    info = await _store_row(driver, conn, schema, location)
    _check_version(info, schema, location, read_only=True)
    _check_tables(tables, schema, location)
    return info


async def migrate_store(driver: Driver, conn: AsyncConnection[Any], schema: str, location: str) -> StoreInfo:
    """Create the store, or bring it to `SCHEMA_VERSION`, in one transaction under the advisory lock.

    Raises:
        StoreFormatUnsupportedError: A foreign schema, or a schema newer than this build.
    """
    s = quoted(schema)
    async with conn.transaction():
        # Hosts opening one store at the same moment queue here; the lock ends with the transaction.
        await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS, _lock_key(schema)))
        tables = await _tables(conn, schema)
        if tables is None:
            await conn.execute(f"CREATE SCHEMA {s}")
            tables = set()
        if tables and "store" not in tables:
            raise _foreign(schema, location, "it has tables but no store table")
        current = 0
        info: StoreInfo | None = None
        if tables:
            info = await _store_row(driver, conn, schema, location)
            _check_version(info, schema, location, read_only=False)
            current = info.schema_version
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                await conn.execute(statement.replace("{s}", s))
        if info is None:
            info = StoreInfo(store_id=str(uuid.uuid4()), schema_version=SCHEMA_VERSION)
            await conn.execute(_INSERT_STORE.replace("{s}", s), (info.store_id, SCHEMA_VERSION))
        elif current < SCHEMA_VERSION:
            await conn.execute(_SET_VERSION.replace("{s}", s), (SCHEMA_VERSION,))
            info = StoreInfo(store_id=info.store_id, schema_version=SCHEMA_VERSION)
        found = await _tables(conn, schema)
        _check_tables(found or set(), schema, location)
    return info
