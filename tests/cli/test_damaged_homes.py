"""`dsh agents` over damaged homes: nothing vanishes silently, nothing hangs, nothing is created or changed.

A child whose stored entry cannot be read (a log that is a directory, a FIFO, a dangling symlink, a
symlink to a non-log, unreadable; a renamed or moved folder; an unreadable folder) is left out of
the rows and counted on stderr (`N stored sessions could not be read; run dsh doctor`) while
`--json` stays exactly the rows; a child whose header only the TypeScript harness accepts is a row.
The command opens the home read-only: every test compares a tree snapshot taken before and after
(docs/cli.md#damage-on-the-command-line). Permission damage (a mode-000 log or folder, a home nobody
may write) is real: those commands run in a child process that honours file modes even when the suite
runs as root (`tests/unprivileged.py`), and a write into an unwritable home ends in one error line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from click.testing import Result
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.persistence.jsonl import encode_header
from tests.helpers import tree_snapshot
from tests.subagent.helpers import write_family_home
from tests.unprivileged import require_permission_checks, run_dsh

runner = CliRunner()

_GUARD_S = 60
_UNLISTED = re.compile(r"^(\d+) stored sessions? could not be read; run dsh --home \S+ doctor$", re.MULTILINE)


def _log(home: Path, session_id: str) -> Path:
    return home / "sessions" / "_no-cwd" / session_id / "session.jsonl.zstd"


def _home(tmp_path: Path, *children: str) -> Path:
    home = tmp_path / "home"
    asyncio.run(write_family_home(home, children))
    return home


def _agents(home: Path, *args: str) -> Result:
    return runner.invoke(app, ["--home", str(home), "agents", "P", *args])


def _unlisted(stderr: str) -> int:
    match = _UNLISTED.search(stderr)
    return int(match.group(1)) if match else 0


def _as_directory(home: Path) -> None:
    log = _log(home, "bad")
    log.unlink()
    log.mkdir()


def _dangling(home: Path) -> None:
    log = _log(home, "bad")
    log.unlink()
    log.symlink_to(home / "nowhere")


def _to_non_log(home: Path) -> None:
    other = home / "notes.txt"
    other.write_bytes(b"\x00" * 100)
    log = _log(home, "bad")
    log.unlink()
    log.symlink_to(other)


def _fifo(home: Path) -> None:
    log = _log(home, "bad")
    log.unlink()
    os.mkfifo(log)


def _renamed(home: Path) -> None:
    folder = _log(home, "bad").parent
    folder.rename(folder.with_name("bad-renamed"))


def _moved(home: Path) -> None:
    folder = _log(home, "bad").parent
    other_project = home / "sessions" / "--elsewhere--"
    other_project.mkdir(mode=0o700)
    shutil.move(str(folder), str(other_project / "bad"))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "log is a directory": _as_directory,
    "log is a dangling symlink": _dangling,
    "log is a symlink to a non-log": _to_non_log,
    "log is a FIFO": _fifo,
    "folder renamed": _renamed,
    "folder moved to another project": _moved,
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_an_unreadable_child_is_counted_on_stderr_not_silently_dropped(tmp_path: Path, damage: str) -> None:
    """The damaged child is no row, stderr says how many entries could not be read, and the home is unchanged."""
    home = _home(tmp_path, "good", "bad")
    DAMAGE[damage](home)
    before = tree_snapshot(home)
    table = _agents(home, "--plain")
    assert table.exit_code == 0, table.output
    assert "good" in table.stdout
    assert "bad" not in table.stdout
    assert _unlisted(table.stderr) == 1, table.stderr
    as_json = _agents(home, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert [row["id"] for row in json.loads(as_json.stdout)] == ["good"]
    assert _unlisted(as_json.stderr) == 1
    assert tree_snapshot(home) == before


def _agents_honouring_modes(home: Path) -> tuple[list[str], int, str]:
    """`dsh agents P` run twice in a child that honours file modes: (JSON row ids, unlisted count, table)."""
    as_json = run_dsh("--home", str(home), "agents", "P", "--json")
    assert as_json.returncode == 0, as_json.stderr
    table = run_dsh("--home", str(home), "agents", "P", "--plain")
    assert table.returncode == 0, table.stderr
    assert _unlisted(table.stderr) == _unlisted(as_json.stderr)
    return [row["id"] for row in json.loads(as_json.stdout)], _unlisted(as_json.stderr), table.stdout


@pytest.mark.slow
def test_a_mode_000_log_is_counted(tmp_path: Path) -> None:
    """A child log with mode 000 (refused by the kernel, even to root) is counted on stderr; the other child lists."""
    require_permission_checks()
    home = _home(tmp_path, "good", "bad")
    _log(home, "bad").chmod(0)
    before = tree_snapshot(home)
    ids, unlisted, table = _agents_honouring_modes(home)
    assert ids == ["good"]
    assert unlisted == 1
    assert "good" in table
    assert "bad" not in table
    assert tree_snapshot(home) == before


@pytest.mark.slow
def test_a_mode_000_session_folder_does_not_fail_the_listing(tmp_path: Path) -> None:
    """A child's session folder with mode 000 (refused even to root) is counted; the whole listing still succeeds."""
    require_permission_checks()
    home = _home(tmp_path, "good", "bad")
    folder = _log(home, "bad").parent
    folder.chmod(0)
    try:
        before = tree_snapshot(home)
        ids, unlisted, table = _agents_honouring_modes(home)
        after = tree_snapshot(home)
    finally:
        folder.chmod(0o700)
    assert ids == ["good"]
    assert unlisted == 1
    assert "good" in table
    assert after == before


def test_an_unreadable_session_folder_does_not_fail_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's session folder the OS refuses to list is counted; the other child still lists (any user)."""
    home = _home(tmp_path, "good", "bad")
    folder = str(_log(home, "bad").parent)
    real_listdir = os.listdir

    def listdir(path: Any) -> list[str]:
        if os.fspath(path) == folder:
            raise PermissionError(13, "Permission denied", folder)
        return real_listdir(path)

    before = tree_snapshot(home)
    monkeypatch.setattr(os, "listdir", listdir)
    result = _agents(home, "--json")
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    assert [row["id"] for row in json.loads(result.stdout)] == ["good"]
    assert _unlisted(result.stderr) == 1
    assert tree_snapshot(home) == before


@pytest.mark.slow
def test_a_fifo_never_hangs_the_command(tmp_path: Path) -> None:
    """A FIFO in place of a child's log: `dsh agents` (a real process) finishes promptly and counts it."""
    home = _home(tmp_path, "good", "bad")
    _fifo(home)
    before = tree_snapshot(home)
    argv = [sys.executable, "-c", "from dsh.cli.main import main; main()", "--home", str(home), "agents", "P"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "good" in done.stdout
    assert _unlisted(done.stderr) == 1
    assert tree_snapshot(home) == before


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while listing ends `dsh agents` with exit 130 and one line, no traceback."""
    home = _home(tmp_path, "good")

    async def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("dsh.subagent.runtime.SubagentRuntime.list_children", interrupted)
    before = tree_snapshot(home)
    result = _agents(home)
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted"
    assert tree_snapshot(home) == before


def test_a_child_with_a_windows_cwd_is_a_row(tmp_path: Path) -> None:
    """A child whose header carries a Windows `cwd` (accepted by the TypeScript harness) is listed normally."""
    home = _home(tmp_path, "good")
    source = _log(home, "good")
    data = source.read_bytes()
    decoder = zstandard.ZstdDecompressor().decompressobj()
    header = json.loads(decoder.decompress(data))
    rest = decoder.unused_data
    header.update(id="win", cwd="C:\\Users\\dev\\work", createdAt=99)
    target = home / "sessions" / "--C-Users-dev-work--" / "win" / "session.jsonl.zstd"
    target.parent.mkdir(parents=True, mode=0o700)
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(encode_header(header))
    target.write_bytes(frame + rest)
    before = tree_snapshot(home)
    result = _agents(home, "--json")
    assert result.exit_code == 0, result.output
    assert [row["id"] for row in json.loads(result.stdout)] == ["good", "win"]
    assert _unlisted(result.stderr) == 0
    assert tree_snapshot(home) == before


@pytest.mark.slow
def test_a_run_on_an_unwritable_home_is_refused_at_open_with_one_line_and_exit_5(tmp_path: Path) -> None:
    """`dsh run` on a mode-555 home (refused even to root): exit 5 and exactly one error line, before any turn."""
    require_permission_checks()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"version": 1, "model": "scripted", "agents": {"main": {"steps": [{"text": "hi"}]}}}))
    home = tmp_path / "locked"
    home.mkdir(mode=0o555)
    try:
        before = tree_snapshot(home)
        done = run_dsh("--home", str(home), "run", "hello", "--script", str(script))
        after = tree_snapshot(home)
    finally:
        home.chmod(0o755)
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    assert "ExceptionGroup" not in done.stderr
    assert done.stderr.splitlines() == [f"error [PERSISTENCE_IO]: cannot write to {home}: permission denied"]
    assert after == before


@pytest.mark.slow
def test_an_unreadable_home_is_one_line_and_the_family_exit_code(tmp_path: Path) -> None:
    """A mode-000 home (refused even to root): read commands exit 5 with one line; doctor fails `home`, exit 7."""
    require_permission_checks()
    home = _home(tmp_path, "good")
    home.chmod(0)
    try:
        before = tree_snapshot(home)
        listed = [run_dsh("--home", str(home), *command) for command in (["agents", "P"], ["sessions"])]
        doctor = run_dsh("--home", str(home), "doctor", "--json")
        after = tree_snapshot(home)
    finally:
        home.chmod(0o700)
    for done in listed:
        assert done.returncode == 5, done.stderr
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith("error [STORE_MISCONFIGURED]: "), line
        assert "is not readable" in line
    assert doctor.returncode == 7, doctor.stderr
    checks = json.loads(doctor.stdout)["checks"]
    assert checks[0] == {"name": "home", "status": "fail", "detail": f"{home} is not readable"}
    assert after == before


@pytest.mark.slow
def test_the_demo_on_an_unreadable_folder_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """`dsh demo --home` a mode-000 folder (refused even to root): one `CONFIG_INVALID` line and exit 4, no usage."""
    require_permission_checks()
    home = tmp_path / "closed"
    home.mkdir(mode=0)
    try:
        done = run_dsh("demo", "--home", str(home), "--plain")
    finally:
        home.chmod(0o700)
    assert done.returncode == 4, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line == (
        f"error [CONFIG_INVALID]: demo home {home} cannot be read (Permission denied); "
        "give an empty or absent folder, or no --home"
    )
    assert list(home.iterdir()) == []
