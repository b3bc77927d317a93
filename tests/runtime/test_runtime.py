"""The composition root: backend selection, the optional cache, the close order and config errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh.config import Config
from dsh.errors import ConfigError
from dsh.persistence.errors import StoreMisconfiguredError
from dsh.persistence.jsonl import JsonlBackend
from dsh.persistence.memory import MemoryBackend
from dsh.persistence.sqlite import SqliteBackend
from dsh.runtime import Runtime, backend_for


def test_default_backend_is_jsonl_under_the_home(tmp_path: Path) -> None:
    """Without a database URL the runtime stores JSONL+zstd logs under `home/sessions`."""
    backend = backend_for(Config(home=tmp_path))
    assert isinstance(backend, JsonlBackend)
    assert Path(backend.root) == tmp_path / "sessions"


def test_sqlite_urls_follow_the_usual_convention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sqlite:////abs` is absolute, `sqlite:///rel` relative to the working directory, `sqlite://` the default."""
    monkeypatch.chdir(tmp_path)
    absolute = backend_for(Config(home=tmp_path, database_url=f"sqlite:///{tmp_path}/a.sqlite3"))
    relative = backend_for(Config(home=tmp_path, database_url="sqlite:///b.sqlite3"))
    default = backend_for(Config(home=tmp_path, database_url="sqlite://"))
    assert isinstance(absolute, SqliteBackend)
    assert isinstance(relative, SqliteBackend)
    assert isinstance(default, SqliteBackend)
    assert Path(absolute.path) == tmp_path / "a.sqlite3"
    assert Path(relative.path) == tmp_path / "b.sqlite3"
    assert Path(default.path) == tmp_path / "sessions.sqlite3"


def test_memory_url_selects_the_memory_backend(tmp_path: Path) -> None:
    """`memory:` selects the in-memory reference backend."""
    assert isinstance(backend_for(Config(home=tmp_path, database_url="memory:")), MemoryBackend)


def test_unknown_scheme_is_a_config_error(tmp_path: Path) -> None:
    """An unsupported URL scheme is refused with `CONFIG_INVALID` before any service starts."""
    with pytest.raises(ConfigError) as caught:
        backend_for(Config(home=tmp_path, database_url="mysql://x"))
    assert caught.value.code == "CONFIG_INVALID"


async def test_runtime_mounts_every_service_and_closes_in_order(tmp_path: Path) -> None:
    """An opened runtime mounts all services; closing releases the subagent units after the cache wrote."""
    async with Runtime.open(Config(home=tmp_path)) as rt:
        services = rt.services
        assert services.sessions is not None
        assert services.persistence is not None
        assert services.projections is not None
        assert services.projection_cache is not None
        assert services.query is not None
        assert services.subagents is not None
        assert set(rt.projections.keys()) >= {"subagent", "subagentTiming"}
        session = rt.sessions.create("s")
        session.append("turn/start", {"turn": 1})
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    assert rt.projections.keys() == ()
    async with Runtime.open(Config(home=tmp_path)) as again:
        assert again.cache is not None
        header = (await again.query.observe_session("s")).header
        cached = await again.cache.cached_snapshot(header, 0, ["subagentTiming"])  # type: ignore[arg-type]
        assert cached is not None
        assert cached.as_of_seq == 1


async def test_a_foreign_cache_file_leaves_the_runtime_without_a_cache(tmp_path: Path) -> None:
    """A cache file owned by another application is refused; the runtime runs on without a cache."""
    import sqlite3

    connection = sqlite3.connect(tmp_path / "cache.sqlite3")
    connection.execute("PRAGMA application_id=7")
    connection.execute("CREATE TABLE other (x)")
    connection.commit()
    connection.close()
    async with Runtime.open(Config(home=tmp_path)) as rt:
        assert rt.cache is None
        assert await rt.subagents.list_children("nobody") == []


async def test_a_writing_open_creates_a_missing_home_and_refuses_a_file_as_home(tmp_path: Path) -> None:
    """A writing open makes a missing home (0700); a home that is a file is one `STORE_MISCONFIGURED` at open."""
    home = tmp_path / "deep" / "home"
    async with Runtime.open(Config(home=home)):
        assert home.is_dir()
        assert home.stat().st_mode & 0o777 == 0o700
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(StoreMisconfiguredError, match="is not a directory"):
        async with Runtime.open(Config(home=not_a_folder)):
            pass
    assert not_a_folder.read_text() == "x"
