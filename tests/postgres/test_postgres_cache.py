"""The PostgreSQL projection cache table: shared by hosts, rebuilt when its shape is foreign, never jsonb.

The cache tests of `tests/projection/` run on this storage too (storage kind `postgres`); these cover
what only the PostgreSQL table has: the table living beside the sessions, two hosts sharing it,
its open rules, and the runtime choosing it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dsh.config import Config
from dsh.persistence.postgres import PostgresBackend
from dsh.projection.cache_postgres import PostgresCacheStorage
from dsh.projection.cache_storage import CacheIdentity, CacheRecord
from dsh.projection.errors import ProjectionError
from dsh.runtime import Runtime
from dsh.session.header import SessionId
from dsh.testing.postgres import ThrowawaySchemas
from tests.postgres.helpers import sql

RECORD = CacheRecord(CacheIdentity(1, "/w", 0), {"counter": {"ver": 1, "seq": 3, "val": {"n": 2, "big": 1e16}}}, 7)


async def test_two_hosts_share_one_cache_table(pg_schemas: ThrowawaySchemas) -> None:
    """A record one host writes is read back exactly by another host's storage; `rows` holds the orjson text."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema) as first, PostgresBackend(url, schema=schema) as second:
        writer = await PostgresCacheStorage.open(first)
        reader = await PostgresCacheStorage.open(second)
        await writer.put(SessionId("s"), RECORD)
        assert await reader.get(SessionId("s")) == RECORD
        [(text,)] = await sql(url, "SELECT rows FROM {s}.projection_cache", schema=schema)
        assert text == orjson.dumps(RECORD.rows).decode()
        await writer.delete(SessionId("s"))
        assert await reader.get(SessionId("s")) is None


async def test_a_cache_table_of_another_shape_is_rebuilt_by_a_writer_and_refused_by_a_reader(
    pg_schemas: ThrowawaySchemas,
) -> None:
    """A foreign cache table is refused read-only (PROJECTION_CACHE_UNAVAILABLE) and rebuilt empty by a writing open."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema):
        pass
    await sql(url, "ALTER TABLE {s}.projection_cache ADD COLUMN extra int", schema=schema)
    async with PostgresBackend(url, schema=schema, read_only=True) as reader:
        with pytest.raises(ProjectionError) as caught:
            await PostgresCacheStorage.open(reader, read_only=True)
        assert caught.value.code == "PROJECTION_CACHE_UNAVAILABLE"
    async with PostgresBackend(url, schema=schema) as writer:
        storage = await PostgresCacheStorage.open(writer)
        await storage.put(SessionId("s"), RECORD)
        assert await storage.get(SessionId("s")) == RECORD
    columns = await sql(
        url,
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = 'projection_cache'",
        [schema],
    )
    assert ("extra",) not in columns


async def test_a_read_only_storage_drops_writes(pg_schemas: ThrowawaySchemas) -> None:
    """A read-only cache storage reads records and silently drops puts and deletes (derived data)."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with PostgresBackend(url, schema=schema) as writer:
        await (await PostgresCacheStorage.open(writer)).put(SessionId("s"), RECORD)
    async with PostgresBackend(url, schema=schema, read_only=True) as reader:
        storage = await PostgresCacheStorage.open(reader, read_only=True)
        await storage.put(SessionId("t"), RECORD)
        await storage.delete(SessionId("s"))
        assert await storage.get(SessionId("s")) == RECORD
        assert await storage.get(SessionId("t")) is None


async def test_the_runtime_keeps_its_cache_beside_postgres_sessions(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """A runtime on a postgresql:// URL uses the PostgreSQL cache storage and creates no cache file."""
    config = Config(home=tmp_path / "home", database_url=pg_schemas.url, postgres={"schema_name": pg_schemas.new()})
    async with Runtime.open(config) as rt:
        assert rt.cache is not None
        assert isinstance(rt.cache.storage, PostgresCacheStorage)
    assert not config.cache_path.exists()
