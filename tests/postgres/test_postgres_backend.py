"""The PostgreSQL store's schema, opens and failures: migrations, foreign schemas, read-only opens, errors.

Every test runs on a real server in its own throw-away schema. Assertions read the catalogue and the
rows with a separate connection (`tests.postgres.helpers.sql`).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import orjson
import pytest

from dsh.persistence.errors import PersistenceIOError, StoreFormatUnsupportedError, StoreMisconfiguredError
from dsh.persistence.postgres import SCHEMA_VERSION, PostgresBackend, mask_url
from dsh.persistence.postgres._reads import Reads
from dsh.testing.io_faults import io_fault
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.stored_logs import append_closed_turn, append_every_core_type
from tests.postgres.helpers import open_host, sql, stored_seqs


async def _schema_exists(url: str, schema: str) -> bool:
    return bool(await sql(url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]))


async def test_hosts_opening_an_empty_schema_together_create_it_once(pg_schemas: ThrowawaySchemas) -> None:
    """Two writing opens at once create the schema once: one store row, one identity for both."""
    url, schema = pg_schemas.url, pg_schemas.new()
    backends = [PostgresBackend(url, schema=schema) for _ in range(3)]
    try:
        await asyncio.gather(*(backend.open() for backend in backends))
        rows = await sql(url, "SELECT store_id::text, schema_version FROM {s}.store", schema=schema)
        assert len(rows) == 1
        assert rows[0][1] == SCHEMA_VERSION
        await backends[0].acquire("x")
    finally:
        for backend in backends:
            await backend.close()


async def test_a_newer_schema_version_is_refused(pg_schemas: ThrowawaySchemas) -> None:
    """A store whose schema_version is newer than this build is STORE_FORMAT_UNSUPPORTED, writing or not."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema):
        pass
    await sql(url, "UPDATE {s}.store SET schema_version = %s", [SCHEMA_VERSION + 1], schema=schema)
    for read_only in (False, True):
        backend = PostgresBackend(url, schema=schema, read_only=read_only)
        with pytest.raises(StoreFormatUnsupportedError) as caught:
            await backend.open()
        await backend.close()
        assert caught.value.code == "STORE_FORMAT_UNSUPPORTED"
        assert "newer" in caught.value.message


async def test_a_foreign_schema_is_refused_and_left_alone(pg_schemas: ThrowawaySchemas) -> None:
    """A schema holding another application's tables is STORE_FORMAT_UNSUPPORTED and gains no table."""
    url, schema = pg_schemas.url, pg_schemas.new()
    await sql(url, "CREATE SCHEMA {s}", schema=schema)
    await sql(url, "CREATE TABLE {s}.orders (id int)", schema=schema)
    for read_only in (False, True):
        backend = PostgresBackend(url, schema=schema, read_only=read_only)
        with pytest.raises(StoreFormatUnsupportedError):
            await backend.open()
        await backend.close()
    tables = await sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema])
    assert tables == [("orders",)]


async def test_read_only_open_of_a_missing_schema_is_an_empty_store_and_creates_nothing(
    pg_schemas: ThrowawaySchemas,
) -> None:
    """A read-only open lists nothing, finds nothing, creates no schema, and refuses writes and leases."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema, read_only=True) as backend:
        assert await backend.list_headers() == ([], [])
        assert await backend.load("s") is None
        assert await backend.read_revision("s") is None
        assert not await backend.exists("s")
        with pytest.raises(StoreMisconfiguredError):
            await backend.acquire("s")
    assert not await _schema_exists(url, schema)


async def test_a_read_only_backend_sees_a_store_created_after_it_opened(pg_schemas: ThrowawaySchemas) -> None:
    """A reader opened before the schema existed lists the sessions a writer stores later."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema, read_only=True) as reader:
        assert await reader.list_headers() == ([], [])
        host = await open_host(url, schema, "w")
        try:
            session = host.store.create("s")
            append_closed_turn(session, 1)
            await host.store.flush(session)
        finally:
            await host.close()
        rows, damaged = await reader.list_headers()
        assert [row.record["id"] for row in rows] == ["s"]
        assert damaged == []
        stored = await reader.load("s")
        assert stored is not None
        assert len(stored.events) == 6


async def test_read_only_connections_cannot_write(pg_schemas: ThrowawaySchemas) -> None:
    """Every connection of a read-only backend refuses a write statement at the server."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema):
        pass
    async with PostgresBackend(url, schema=schema, read_only=True) as reader:
        with pytest.raises(PersistenceIOError) as caught:
            await reader.run(lambda conn: conn.execute("DELETE FROM {s}.store".replace("{s}", f'"{schema}"')), "write")
        assert "read-only" in caught.value.message


async def test_json_columns_hold_the_exact_orjson_text(pg_schemas: ThrowawaySchemas) -> None:
    """`data` is `text` (never jsonb) and holds exactly the orjson bytes of each event's data, key order kept."""
    url, schema = pg_schemas.url, pg_schemas.new()
    host = await open_host(url, schema, "j")
    try:
        session = host.store.create("s")
        append_every_core_type(session)
        session.append("session/title", {"title": "z", "messageSeqs": [], "source": {"kind": "user"}, "a": 1e16})
        await host.store.flush(session)
    finally:
        await host.close()
    rows = await sql(url, "SELECT data FROM {s}.events WHERE session_id = 's' ORDER BY seq", schema=schema)
    assert [row[0] for row in rows] == [orjson.dumps(event.data).decode() for event in session.events]
    types = await sql(
        url,
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND data_type IN ('json', 'jsonb')",
        [schema],
    )
    assert types == []


@pytest.mark.parametrize("kind", ["partial-write", "sync", "rollback"])
async def test_a_fault_inside_the_append_transaction_rolls_the_batch_back(
    pg_schemas: ThrowawaySchemas, kind: str
) -> None:
    """A fault after half the rows, or before COMMIT, leaves rows, revision and lease alone; the retry stores once."""
    url, schema = pg_schemas.url, pg_schemas.new()
    host = await open_host(url, schema, "f")
    state = (
        "SELECT s.revision, s.next_seq, l.expires_at FROM {s}.sessions s "
        "JOIN {s}.session_leases l ON l.session_id = s.id"
    )
    try:
        session = host.store.create("s")
        append_closed_turn(session, 1)
        await host.store.flush(session)
        before = await sql(url, state, schema=schema)
        append_closed_turn(session, 2)
        with io_fault(host.backend, kind) as shot, pytest.raises(PersistenceIOError, match=f"injected {kind}"):
            await host.store.flush(session)
        assert shot.struck
        assert await sql(url, state, schema=schema) == before
        assert await stored_seqs(url, schema, "s") == list(range(6))
        await host.store.flush(session)
        assert await stored_seqs(url, schema, "s") == list(range(12))
    finally:
        await host.close()


async def test_parent_listing_and_typed_reads_use_their_indexes(pg_schemas: ThrowawaySchemas) -> None:
    """The plans of a parent listing (sequential scans discouraged) and a typed read name the two indexes."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema):
        pass

    reads = Reads(schema)  # the statements the backend runs

    async def plan(statement: str, parameters: list[object]) -> str:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SET enable_seqscan = off")
            cursor = await conn.execute("EXPLAIN " + statement, parameters)
            return "\n".join(str(row[0]) for row in await cursor.fetchall())

    children = await plan(reads._children, [["p"], False])
    typed = await plan(reads._typed, ["s", "turn/end", 0])
    assert "sessions_by_parent" in children
    assert "events_by_type" in typed


async def test_an_unreachable_server_is_one_line_with_the_password_masked() -> None:
    """A refused connection is one PERSISTENCE_IO line naming the masked URL, never the password."""
    url = "postgresql://someone:hunter2@127.0.0.1:1/nowhere"
    backend = PostgresBackend(url, connect_timeout_s=2)
    with pytest.raises(PersistenceIOError) as caught:
        await backend.open()
    await backend.close()
    message = caught.value.message
    assert "\n" not in message
    assert "hunter2" not in message
    assert "postgresql://someone:***@127.0.0.1:1/nowhere" in message


def test_urls_are_masked_in_the_user_part_and_the_query() -> None:
    """`mask_url` hides a password given in the user part or as a `password=` parameter."""
    assert mask_url("postgresql://u:p@h:5/db") == "postgresql://u:***@h:5/db"
    assert (
        mask_url("postgresql://u@h/db?sslmode=require&password=p") == "postgresql://u@h/db?sslmode=require&password=***"
    )
    assert mask_url("postgresql://h/db") == "postgresql://h/db"


async def test_unknown_role_is_one_line(pg_schemas: ThrowawaySchemas) -> None:
    """Credentials the server refuses give one PERSISTENCE_IO line naming the masked URL."""
    base = pg_schemas.url.split("://", 1)[1].split("@", 1)[-1]
    backend = PostgresBackend(f"postgresql://no_such_role_dsh:pw@{base}")
    with pytest.raises(PersistenceIOError) as caught:
        await backend.open()
    await backend.close()
    assert "\n" not in caught.value.message
    assert "no_such_role_dsh:***@" in caught.value.message
    assert ":pw@" not in caught.value.message


async def test_synchronous_commit_off_is_warned_at_open(
    pg_schemas: ThrowawaySchemas, caplog: pytest.LogCaptureFixture
) -> None:
    """Opening a store whose connections run with synchronous_commit off logs one warning."""
    caplog.set_level(logging.WARNING, logger="dsh.persistence")
    url = pg_schemas.url
    separator = "&" if "?" in url else "?"
    backend = PostgresBackend(f"{url}{separator}options=-c%20synchronous_commit%3Doff", schema=pg_schemas.new())
    async with backend:
        pass
    assert [record.message for record in caplog.records if "synchronous_commit is off" in record.message]


async def test_connections_carry_the_statement_timeout(pg_schemas: ThrowawaySchemas) -> None:
    """Pooled connections run with the configured statement and idle-transaction timeouts."""
    async with PostgresBackend(pg_schemas.url, schema=pg_schemas.new(), statement_timeout_ms=1234) as backend:

        async def settings(conn: object) -> list[object]:
            found = []
            for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
                cursor = await conn.execute(f"SHOW {name}")  # type: ignore[attr-defined]
                found.append((await cursor.fetchone())[0])
            return found

        assert await backend.run(settings, "show settings") == ["1234ms", "1234ms"]


@pytest.mark.slow
def test_importing_the_backend_package_does_not_load_the_driver() -> None:
    """`import dsh.persistence.postgres` and the runtime leave psycopg unloaded until a backend is built."""
    code = (
        "import sys, dsh.persistence.postgres, dsh.runtime, dsh.testing.postgres, dsh.projection.cache_postgres; "
        "assert 'psycopg' not in sys.modules, 'psycopg was imported'; "
        "dsh.persistence.postgres.PostgresBackend('postgresql://h/db'); "
        "assert 'psycopg' in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
