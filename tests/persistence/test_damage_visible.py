"""Damage stays visible: every stored entry the JSONL listing cannot trust is reported, none vanishes.

One unreadable entry never fails the listing (docs/storage-format.md#damage-stays-visible): a log
that is unreadable, a directory, a dangling symlink, a symlink to something that is not a log or a
FIFO, a renamed or moved session folder, an unreadable session or project folder — each lands in
`damaged` (with the id its folder names) while every other session lists. A FIFO is never opened,
so nothing blocks. A header only the TypeScript harness accepts (a Windows `cwd`) lists and reads.
Mode-000 logs and folders are listed by a child process that honours file modes even when the suite
runs as root (`tests/unprivileged.py`), so the kernel's refusal is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from dsh.persistence.errors import PersistenceIOError, SessionCorruptionError
from dsh.persistence.headers import read_stored_header, upstream_only_reason
from dsh.persistence.jsonl import _backend as jsonl_backend
from dsh.session.header import StoredHeaderError
from dsh.testing.stored_logs import stored_header
from tests.helpers import tree_snapshot
from tests.persistence.helpers import closed_records, make_backend, make_writer, running
from tests.unprivileged import require_permission_checks, run_python

_LISTING_CHILD = """
import asyncio, json, sys
from pathlib import Path
from tests.persistence.helpers import make_backend, running

async def main() -> None:
    async with running(make_backend(Path(sys.argv[1]), sys.argv[2])) as (coordinator, _):
        listing = await coordinator.list()
    damaged = [[item.session_id, item.code, item.location] for item in listing.damaged]
    print(json.dumps({"ids": [row.header.id for row in listing.rows], "damaged": damaged}))

asyncio.run(main())
"""


async def _home(tmp_path: Path, compression: str, *ids: str) -> tuple[Path, Any]:
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    for index, session_id in enumerate(ids):
        await writer.write(session_id, stored_header(session_id, created_at=1000 + index), closed_records(1))
    return root, writer


async def _listing(root: Path, compression: str, **backend: Any) -> tuple[list[str], list[Any]]:
    async with running(make_backend(root, compression, **backend)) as (coordinator, _):
        listing = await coordinator.list()
    return [row.header.id for row in listing.rows], listing.damaged


def _listing_honouring_modes(root: Path, compression: str) -> tuple[list[str], list[list[str]]]:
    """The JSONL listing run in a child that honours file modes: (row ids, [id, code, location] per damaged)."""
    done = run_python(_LISTING_CHILD, str(root), compression)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    return report["ids"], report["damaged"]


@contextlib.contextmanager
def _fifo_watch(path: Path) -> Iterator[list[str]]:
    """Report whether anyone opened the FIFO for reading (and unblock such a reader so a regression
    cannot hang the suite): a non-blocking writer open only succeeds while a reader has it open."""
    opened: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.005)
                continue
            opened.append("reader")
            os.close(fd)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        stop.set()
        thread.join(timeout=5)


# ---------------------------------------------------------------- logs that are not regular files


async def test_a_log_that_is_a_directory_is_reported_not_dropped(tmp_path: Path, compression: str) -> None:
    """A directory in place of a log is a damaged entry naming its id; the other sessions still list."""
    root, writer = await _home(tmp_path, compression, "good", "bad")
    path = Path(writer.path_of("bad"))
    path.unlink()
    path.mkdir()
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.session_id, item.location, item.code) for item in damaged] == [("bad", str(path), "PERSISTENCE_IO")]
    assert "a directory" in damaged[0].message


async def test_a_dangling_symlink_is_reported_and_its_read_is_a_clear_error(tmp_path: Path, compression: str) -> None:
    """A dangling symlink in place of a log is damaged; inspecting it is `PERSISTENCE_IO`, not "not found"."""
    root, writer = await _home(tmp_path, compression, "good", "bad")
    path = Path(writer.path_of("bad"))
    path.unlink()
    path.symlink_to(tmp_path / "nowhere")
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [item.session_id for item in damaged] == ["bad"]
    assert "dangling symbolic link" in damaged[0].message
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(PersistenceIOError, match="dangling symbolic link"):
            await coordinator.inspect("bad")


async def test_a_symlink_to_a_non_log_is_reported(tmp_path: Path, compression: str) -> None:
    """A symlink to a file that is not a session log is a damaged entry (its first record is no header)."""
    root, writer = await _home(tmp_path, compression, "good", "bad")
    other = tmp_path / "notes.txt"
    other.write_bytes(b"not a log\nat all\n" if compression == "none" else b"\x00" * 64)
    path = Path(writer.path_of("bad"))
    path.unlink()
    path.symlink_to(other)
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.session_id, item.code) for item in damaged] == [("bad", "SESSION_CORRUPT")]


async def test_a_fifo_is_never_opened_by_a_listing_or_a_read(tmp_path: Path, compression: str) -> None:
    """A FIFO in place of a log is reported without being opened: the listing and inspect return at once."""
    root, writer = await _home(tmp_path, compression, "good", "pipe")
    path = Path(writer.path_of("pipe"))
    path.unlink()
    os.mkfifo(path)
    with _fifo_watch(path) as opened:
        ids, damaged = await asyncio.wait_for(_listing(root, compression), timeout=30)
        async with running(make_backend(root, compression)) as (coordinator, _):
            with pytest.raises(PersistenceIOError, match="FIFO"):
                await asyncio.wait_for(coordinator.inspect("pipe"), timeout=30)
            with pytest.raises(PersistenceIOError, match="FIFO"):
                await asyncio.wait_for(coordinator.revision("pipe"), timeout=30)
    assert ids == ["good"]
    assert [item.session_id for item in damaged] == ["pipe"]
    assert opened == []


async def test_an_unreadable_log_is_reported_and_the_rest_lists(tmp_path: Path, compression: str) -> None:
    """A log the OS refuses to open (permissions) is one damaged entry; the listing goes on."""
    root, writer = await _home(tmp_path, compression, "good", "locked")
    locked = writer.path_of("locked")

    def opener(path: str, mode: str) -> IO[bytes]:
        if path == locked:
            raise PermissionError(13, "Permission denied", path)
        return open(path, mode)

    ids, damaged = await _listing(root, compression, opener=opener)
    assert ids == ["good"]
    assert [(item.session_id, item.code, item.location) for item in damaged] == [("locked", "PERSISTENCE_IO", locked)]


@pytest.mark.slow
async def test_a_mode_000_log_is_reported(tmp_path: Path, compression: str) -> None:
    """A log with mode 000 (refused by the kernel, even to root) is a damaged entry, not a vanished session."""
    require_permission_checks()
    root, writer = await _home(tmp_path, compression, "good", "locked")
    path = Path(writer.path_of("locked"))
    path.chmod(0)
    before = tree_snapshot(root)
    ids, damaged = _listing_honouring_modes(root, compression)
    assert ids == ["good"]
    assert damaged == [["locked", "PERSISTENCE_IO", str(path)]]
    assert tree_snapshot(root) == before


# ---------------------------------------------------------------- folders


async def test_an_unreadable_session_folder_does_not_fail_the_listing(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session folder the OS refuses to list is one damaged entry naming its id; the rest lists."""
    root, writer = await _home(tmp_path, compression, "good", "closed")
    folder = os.path.dirname(writer.path_of("closed"))
    real_listdir = os.listdir

    def listdir(path: Any) -> list[str]:
        if os.fspath(path) == folder:
            raise PermissionError(13, "Permission denied", folder)
        return real_listdir(path)

    monkeypatch.setattr(jsonl_backend.os, "listdir", listdir)
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.session_id, item.location, item.code) for item in damaged] == [("closed", folder, "PERSISTENCE_IO")]


@pytest.mark.slow
async def test_a_mode_000_session_folder_does_not_fail_the_listing(tmp_path: Path, compression: str) -> None:
    """A session folder with mode 000 (refused even to root) is reported; the listing and the backend's open succeed."""
    require_permission_checks()
    root, writer = await _home(tmp_path, compression, "good", "closed")
    folder = Path(writer.path_of("closed")).parent
    folder.chmod(0)
    try:
        before = tree_snapshot(root)
        ids, damaged = _listing_honouring_modes(root, compression)
        after = tree_snapshot(root)
    finally:
        folder.chmod(0o700)
    assert ids == ["good"]
    assert damaged == [["closed", "PERSISTENCE_IO", str(folder)]]
    assert after == before


async def test_an_unreadable_project_folder_does_not_fail_the_listing(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project folder the OS refuses to list is reported; the sessions of other projects list."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("good", stored_header("good", cwd="/a"), closed_records(1))
    await writer.write("hidden", stored_header("hidden", cwd="/b"), closed_records(1))
    project = os.path.dirname(os.path.dirname(writer.path_of("hidden")))
    real_scandir = os.scandir

    def scandir(path: Any) -> Any:
        if os.fspath(path) == project:
            raise PermissionError(13, "Permission denied", project)
        return real_scandir(path)

    monkeypatch.setattr(jsonl_backend.os, "scandir", scandir)
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.location, item.code) for item in damaged] == [(project, "PERSISTENCE_IO")]


async def test_a_renamed_session_folder_is_reported(tmp_path: Path, compression: str) -> None:
    """A session folder renamed away from its id is reported (the header no longer names this path)."""
    root, writer = await _home(tmp_path, compression, "good", "moved")
    folder = Path(writer.path_of("moved")).parent
    folder.rename(folder.with_name("renamed"))
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.session_id, item.code) for item in damaged] == [("renamed", "SESSION_CORRUPT")]


async def test_a_session_folder_moved_to_another_project_is_reported(tmp_path: Path, compression: str) -> None:
    """A session folder moved under another project folder is reported, not silently dropped."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("good", stored_header("good", cwd="/a"), closed_records(1))
    await writer.write("moved", stored_header("moved", cwd="/b"), closed_records(1))
    folder = Path(writer.path_of("moved")).parent
    target = Path(writer.path_of("good")).parent.parent / folder.name
    shutil.move(str(folder), str(target))
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.session_id, item.code) for item in damaged] == [("moved", "SESSION_CORRUPT")]
    assert "identify" in damaged[0].message


async def test_a_duplicate_id_names_the_session(tmp_path: Path, compression: str) -> None:
    """One id stored in two project folders is two damaged entries carrying that id."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("twice", stored_header("twice", cwd="/a"), closed_records(1))
    second = Path(writer.path_for("twice", cwd="/b"))
    second.parent.mkdir(parents=True)
    second.write_bytes(writer.encode(stored_header("twice", cwd="/b"), closed_records(1)))
    ids, damaged = await _listing(root, compression)
    assert ids == []
    assert [item.session_id for item in damaged] == ["twice", "twice"]


async def test_a_damaged_listing_changes_nothing(tmp_path: Path, compression: str) -> None:
    """Listing and reading a home full of damaged entries leaves every byte, mode and mtime as it was."""
    root, writer = await _home(tmp_path, compression, "good", "dir", "dangling", "pipe")
    for session_id in ("dir", "dangling", "pipe"):
        Path(writer.path_of(session_id)).unlink()
    Path(writer.path_for("dir")).mkdir()
    Path(writer.path_for("dangling")).symlink_to(tmp_path / "nowhere")
    os.mkfifo(writer.path_for("pipe"))
    before = tree_snapshot(root)
    async with running(make_backend(root, compression)) as (coordinator, _):
        await coordinator.list()
        for session_id in ("good", "dir", "dangling", "pipe"):
            with contextlib.suppress(PersistenceIOError):
                await coordinator.inspect(session_id)
    assert tree_snapshot(root) == before


# ---------------------------------------------------------------- headers only the TypeScript harness accepts


@pytest.mark.parametrize("cwd", ["C:\\Users\\dev\\project", "relative/dir", ""])
async def test_an_upstream_only_cwd_lists_and_reads(tmp_path: Path, compression: str, cwd: str) -> None:
    """A header whose cwd the TypeScript harness accepts (Windows, relative) lists and reads as stored."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("win", stored_header("win", cwd=cwd), closed_records(1))
    async with running(make_backend(root, compression)) as (coordinator, _):
        listing = await coordinator.list()
        assert [row.header.cwd for row in listing.rows] == [cwd]
        assert listing.damaged == []
        observation = await coordinator.inspect("win")
    assert observation.header.cwd == cwd
    assert upstream_only_reason(observation.header) is not None


def test_the_upstream_header_rule_keeps_every_other_check() -> None:
    """Only the cwd rule is relaxed: an absolute cwd is no warning, and other invalid fields still refuse."""
    header, cut = read_stored_header(stored_header("s", cwd="/srv/x"))
    assert (header.cwd, cut, upstream_only_reason(header)) == ("/srv/x", 0, None)
    with pytest.raises(StoredHeaderError):
        read_stored_header(stored_header("s", cwd="C:\\x", origin="elsewhere"))
    with pytest.raises(StoredHeaderError):
        read_stored_header(stored_header("s", cwd=7))


async def test_an_invalid_header_is_still_damaged(tmp_path: Path, compression: str) -> None:
    """A header neither reader accepts stays out of the rows and is reported with its id."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("good", stored_header("good"), closed_records(1))
    await writer.write("bad", stored_header("bad", createdAt=-5), closed_records(1))
    ids, damaged = await _listing(root, compression)
    assert ids == ["good"]
    assert [(item.session_id, item.code) for item in damaged] == [("bad", "SESSION_CORRUPT")]
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionCorruptionError):
            await coordinator.inspect("bad")


async def test_an_unreadable_project_folder_does_not_break_lookups_elsewhere(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a session still works while another project folder cannot be searched (permissions)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("good", stored_header("good", cwd="/a"), closed_records(1))
    await writer.write("hidden", stored_header("hidden", cwd="/b"), closed_records(1))
    project = os.path.dirname(os.path.dirname(writer.path_of("hidden")))
    real_lstat = os.lstat

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path).startswith(project + os.sep):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(jsonl_backend.os, "lstat", lstat)
    async with running(make_backend(root, compression)) as (coordinator, _):
        observation = await coordinator.inspect("good")
    assert observation.header.id == "good"
