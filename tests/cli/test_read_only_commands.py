"""Read-only commands are reads: `dsh agents`, `dsh sessions`, `dsh history` and `dsh doctor` change nothing.

They open the home with `Runtime.open(config, read_only=True)` (docs/cli.md#read-only-commands): no
folder, file or table appears (no `sessions/`, no `cache.sqlite3`, no SQLite database or its
folder), a missing store is one clear line with exit 5, a 0-byte SQLite store is reported (exit 5)
and left at 0 bytes, and an unknown parent says so on stderr. Every test compares a tree snapshot
taken before and after (SQLite's `-wal`/`-shm` files left out).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from tests.helpers import tree_snapshot

runner = CliRunner()


async def _populate(config: Config) -> None:
    async with Runtime.open(config) as rt:
        parent = rt.sessions.create("P")
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        descriptor = snapshot_descriptor("continuable", provider="spawn", label="Collect sources")
        child = rt.sessions.create(
            "C1",
            header=HeaderInit(parent_session="P", origin="subagent", delegation_depth=1),
            seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
        )
        child.append("turn/start", {"turn": 1})
        child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        for session in (parent, child):
            await rt.sessions.flush(session)


def _one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_missing_home_named_by_a_sqlite_url_is_one_line_and_is_not_created(tmp_path: Path) -> None:
    """`dsh --database-url sqlite:// agents` on a home that does not exist: exit 5, one line, no folder made."""
    before = tree_snapshot(tmp_path)
    result = runner.invoke(app, ["--home", str(tmp_path / "fresh"), "--database-url", "sqlite://", "agents", "P"])
    assert result.exit_code == 5, result.output
    assert _one_line(result.stderr).startswith("error [STORE_MISCONFIGURED]: no dsh home at ")
    assert tree_snapshot(tmp_path) == before


def test_a_sqlite_url_whose_folder_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    """A SQLite URL naming a missing folder: exit 5, one line, no folder and no initialised database."""
    home = tmp_path / "home"
    home.mkdir()
    url = f"sqlite:///{tmp_path}/missing/dir/sessions.sqlite3"
    before = tree_snapshot(tmp_path)
    for command in (["agents", "P"], ["agents", "P", "--json"]):
        result = runner.invoke(app, ["--home", str(home), "--database-url", url, *command])
        assert result.exit_code == 5, result.output
        assert "no SQLite session store" in _one_line(result.stderr)
        assert result.stdout == ""
    assert tree_snapshot(tmp_path) == before


def test_a_zero_byte_sqlite_store_is_reported_and_left_alone(tmp_path: Path) -> None:
    """A 0-byte SQLite store: `dsh agents` exits 5 with one line, and the file stays 0 bytes."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    store = home / "sessions.sqlite3"
    store.touch(mode=0o600)
    before = tree_snapshot(tmp_path)
    result = runner.invoke(app, ["--home", str(home), "--database-url", "sqlite://", "agents", "P"])
    assert result.exit_code == 5, result.output
    assert "empty file" in _one_line(result.stderr)
    assert store.stat().st_size == 0
    assert tree_snapshot(tmp_path) == before


def test_an_empty_home_creates_no_cache_and_no_sessions_folder(tmp_path: Path) -> None:
    """On an existing but empty home `dsh agents` works and creates no `cache.sqlite3` or `sessions/`."""
    before = tree_snapshot(tmp_path)
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", "P", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert tree_snapshot(tmp_path) == before
    assert not (tmp_path / "cache.sqlite3").exists()


@pytest.mark.parametrize("url", [None, "sqlite://"])
def test_agents_and_doctor_leave_a_populated_home_unchanged(tmp_path: Path, url: str | None) -> None:
    """Listing (table, JSON, descendants) and doctor change no byte, mode or mtime of a populated home."""
    config = Config(home=tmp_path) if url is None else Config(home=tmp_path, database_url=url)
    asyncio.run(_populate(config))
    assert (tmp_path / "cache.sqlite3").exists()
    globals_ = ["--home", str(tmp_path)] + ([] if url is None else ["--database-url", url])
    before = tree_snapshot(tmp_path)
    for command in (["agents", "P"], ["agents", "P", "--json"], ["agents", "P", "--descendants"], ["doctor"]):
        result = runner.invoke(app, [*globals_, *command])
        assert result.exit_code == 0, (command, result.output)
        assert tree_snapshot(tmp_path) == before, command
    listed = runner.invoke(app, [*globals_, "agents", "P", "--json"])
    assert [row["label"] for row in json.loads(listed.stdout)] == ["Collect sources"]


def test_a_populated_home_without_its_cache_gets_no_new_cache(tmp_path: Path) -> None:
    """With `cache.sqlite3` removed, every read-only command lists and reads without it and creates none."""
    asyncio.run(_populate(Config(home=tmp_path)))
    (tmp_path / "cache.sqlite3").unlink()
    before = tree_snapshot(tmp_path)
    for command in (["agents", "P"], ["agents", "P", "--json"], ["sessions"], ["history", "C1"], ["doctor"]):
        result = runner.invoke(app, ["--home", str(tmp_path), *command])
        assert result.exit_code == 0, (command, result.output)
        assert tree_snapshot(tmp_path) == before, command
    listed = runner.invoke(app, ["--home", str(tmp_path), "agents", "P", "--json"])
    assert [row["label"] for row in json.loads(listed.stdout)] == ["Collect sources"]
    assert not (tmp_path / "cache.sqlite3").exists()


def test_an_unknown_parent_says_so_on_stderr(tmp_path: Path) -> None:
    """`dsh agents X` for an id that is not stored prints `(no subagents)`, and `no session X in <home>` on stderr."""
    asyncio.run(_populate(Config(home=tmp_path)))
    table = runner.invoke(app, ["--home", str(tmp_path), "agents", "X"])
    assert table.exit_code == 0, table.output
    assert "(no subagents)" in table.stdout
    assert table.stderr == f"no session X in {tmp_path}\n"
    as_json = runner.invoke(app, ["--home", str(tmp_path), "agents", "X", "--json"])
    assert (as_json.exit_code, json.loads(as_json.stdout)) == (0, [])
    assert as_json.stderr == f"no session X in {tmp_path}\n"
    known = runner.invoke(app, ["--home", str(tmp_path), "agents", "C1"])
    assert (known.exit_code, known.stderr) == (0, "")
    assert "(no subagents)" in known.stdout


def test_a_lone_surrogate_id_on_sqlite_is_a_clean_unknown_parent(tmp_path: Path) -> None:
    """A parent id holding a lone surrogate (argv that was not UTF-8) on SQLite: exit 0, escaped hint, no traceback."""
    asyncio.run(_populate(Config(home=tmp_path, database_url="sqlite://")))
    globals_ = ["--home", str(tmp_path), "--database-url", "sqlite://"]
    result = runner.invoke(app, [*globals_, "agents", "bad\udcff"])
    assert result.exit_code == 0, result.output
    assert "(no subagents)" in result.stdout
    assert result.stderr == f"no session bad\\udcff in {tmp_path}\n"
    as_json = runner.invoke(app, [*globals_, "agents", "x\udcff", "--json"])
    assert (as_json.exit_code, json.loads(as_json.stdout)) == (0, [])
