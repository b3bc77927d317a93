"""`Runtime.open(config, read_only=True)`: the open every read-only command uses creates and changes nothing.

No home, folder, cache file or table is created; the projection cache is used only when its file
already exists (opened `mode=ro`, writes dropped); a missing home is one `STORE_MISCONFIGURED`
error; no agent starts (docs/cli.md#read-only-commands).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh.config import Config
from dsh.errors import ConfigError
from dsh.persistence.errors import StoreMisconfiguredError
from dsh.projection.cache_storage import CacheIdentity, CacheRecord, SqliteCacheStorage
from dsh.runtime import Runtime
from dsh.session.header import SessionId
from tests.helpers import tree_snapshot


async def test_a_missing_default_home_is_an_empty_store_and_not_created(tmp_path: Path) -> None:
    """The default store in a home that does not exist yet: the runtime opens empty, and no folder appears."""
    before = tree_snapshot(tmp_path)
    async with Runtime.open(Config(home=tmp_path / "absent"), read_only=True) as rt:
        assert rt.cache is None
        assert (await rt.persistence.list()).rows == []
        assert await rt.subagents.list_children("P") == []
    assert tree_snapshot(tmp_path) == before


async def test_a_missing_home_named_by_a_sqlite_url_is_refused_and_not_created(tmp_path: Path) -> None:
    """`sqlite://` names the database in a home that does not exist: `STORE_MISCONFIGURED`, no folder appears."""
    before = tree_snapshot(tmp_path)
    with pytest.raises(StoreMisconfiguredError, match="no dsh home"):
        async with Runtime.open(Config(home=tmp_path / "absent", database_url="sqlite://"), read_only=True):
            pass
    assert tree_snapshot(tmp_path) == before


async def test_an_empty_home_runs_without_a_cache_and_creates_nothing(tmp_path: Path) -> None:
    """An existing, empty home: the runtime opens, has no projection cache, and the home stays empty."""
    before = tree_snapshot(tmp_path)
    async with Runtime.open(Config(home=tmp_path), read_only=True) as rt:
        assert rt.read_only
        assert rt.cache is None
        assert await rt.subagents.list_children("P") == []
    assert tree_snapshot(tmp_path) == before


async def test_an_existing_cache_is_read_only_and_drops_writes(tmp_path: Path) -> None:
    """With `cache.sqlite3` present the runtime uses it read-only: writes are dropped, the file is unchanged."""
    async with Runtime.open(Config(home=tmp_path)):
        pass
    assert (tmp_path / "cache.sqlite3").exists()
    before = tree_snapshot(tmp_path)
    async with Runtime.open(Config(home=tmp_path), read_only=True) as rt:
        assert rt.cache is not None
        storage = rt.cache.storage
        assert isinstance(storage, SqliteCacheStorage)
        assert storage.read_only
        await storage.put(SessionId("x"), CacheRecord(CacheIdentity(1, None, 0), {}))
        assert await storage.get(SessionId("x")) is None
    assert tree_snapshot(tmp_path) == before


async def test_a_read_only_runtime_starts_no_agent(tmp_path: Path) -> None:
    """Creating or resuming an agent on a read-only runtime is refused with `CONFIG_INVALID`."""
    async with Runtime.open(Config(home=tmp_path), read_only=True) as rt:
        with pytest.raises(ConfigError, match="read-only"):
            await rt.create_agent()
        with pytest.raises(ConfigError, match="read-only"):
            await rt.resume_agent("P")


def test_read_only_must_be_a_bool(tmp_path: Path) -> None:
    """`read_only` is validated like every other argument."""
    with pytest.raises(ConfigError):
        Runtime.open(Config(home=tmp_path), read_only="yes")  # type: ignore[arg-type]
