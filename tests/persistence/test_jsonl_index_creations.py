"""Creating a session adds it to the JSONL parent index without reading its project folder.

See docs/storage-format.md#creations-and-the-index: the session folder is created under the index
lock between two `lstat`s of its project folder, the new folder is appended to the index when the
index described the folder just before and the folder changed by that one subfolder, and the folder
is read again otherwise. Every row a filtered listing returns is still the full enumeration's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from dsh.persistence.jsonl import FILE_READS, project_key
from dsh.persistence.jsonl import _backend as backend_module
from dsh.persistence.jsonl import _index as index_module
from dsh.persistence.jsonl import _listing as listing_module
from dsh.persistence.jsonl._index import Entry, IndexFiles
from dsh.session import HeaderInit, SessionStore
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import append_note, stored_header
from tests.persistence.helpers import CountingOpener, closed_records, make_backend, make_writer, running

FOLDER = "/work/crowded"


async def _crowded(root: Path, compression: str, count: int, children: int) -> None:
    """`count` stored sessions in one project folder (the first `children` are children of `P`),
    written straight into the root, then one writing open, which indexes the folder."""
    writer = make_writer(root, compression)
    for index in range(count):
        session_id = f"s{index:04d}"
        family = {"parentSession": "P", "origin": "subagent", "delegationDepth": 1} if index < children else {}
        header = stored_header(session_id, created_at=index + 1, cwd=FOLDER, **family)
        await writer.write(session_id, header, closed_records(1))
    async with running(make_backend(root, compression)):
        pass


async def _create(store: SessionStore, session_id: str, *, parent: str | None = "P", at: int = 5_000) -> None:
    """Create `session_id` in the crowded folder through the store, flush it (materialized), retire it."""
    session = store.create(
        session_id,
        header=HeaderInit(
            cwd=FOLDER,
            parent_session=parent,
            origin="subagent" if parent else None,
            delegation_depth=1 if parent else 0,
            created_at=at,
        ),
    )
    append_note(session, 0)
    await store.flush(session)
    store.dispose(session)


def _foreign(writer: JsonlLogWriter, session_id: str, *, parent: str = "P") -> None:
    """A session written by a process that takes no index lock (synchronously: it runs inside a creation)."""
    header = stored_header(session_id, created_at=9_000, cwd=FOLDER, parentSession=parent, origin="subagent")
    path = writer.path_for(session_id, cwd=FOLDER)
    os.makedirs(os.path.dirname(path))
    Path(path).write_bytes(writer.encode(header, closed_records(1)))


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        purpose: count - before.get(purpose, 0) for purpose, count in after.items() if count > before.get(purpose, 0)
    }


def _indexed(root: Path) -> dict[str, Entry]:
    view = IndexFiles(f"{root}.index", writable=False).load()
    assert view is not None
    return view.folder_entries(project_key(FOLDER))


def _scanned(root: Path, compression: str) -> dict[str, Entry]:
    """The crowded folder's entries as a scan reads them (the reference every index write must equal)."""
    reader = listing_module.FolderReader(open)  # type: ignore[arg-type]
    listing = listing_module.StoreListing(str(root), reader, IndexFiles(f"{root}.unused", writable=False))
    project = root / project_key(FOLDER)
    scanned = listing._read_folder(project.name, str(project), [], [])
    assert scanned is not None
    return scanned[1]


async def _filtered(root: Path, compression: str, parents: Iterable[str | None]) -> tuple[list[str], int]:
    """A read-only listing by parent: (row ids, header files opened)."""
    backend = make_backend(root, compression, read_only=True)
    await backend.open()
    try:
        before = FILE_READS.snapshot().get("head", 0)
        rows, _ = await backend.list_headers(parents=frozenset(parents))
        return [row.record["id"] for row in rows], FILE_READS.snapshot().get("head", 0) - before
    finally:
        await backend.close()


async def _expected(root: Path, compression: str, parents: set[str | None]) -> list[str]:
    backend = make_backend(root, compression, read_only=True)
    await backend.open()
    try:
        rows, _ = await backend.list_headers()
        return [row.record["id"] for row in rows if row.record.get("parentSession") in parents]
    finally:
        await backend.close()


async def test_creating_the_1001st_session_reads_no_other_session_and_lists_no_folder(
    tmp_path: Path, compression: str
) -> None:
    """In a folder of 1,000 sessions, ten creations open no file of another session and list no folder.

    Counted at the backend's file layer (`FILE_READS`: header, log, revision, index and folder
    reads) and at its opener. The index then holds exactly what a scan of the folder finds, and a
    listing by parent reads the family's headers only and lists every child, the new ones included.
    """
    root = tmp_path / "sessions"
    await _crowded(root, compression, 1_000, 20)
    opener = CountingOpener()
    async with running(make_backend(root, compression, opener=opener)) as (_, store):
        before = FILE_READS.snapshot()
        for index in range(10):
            await _create(store, f"new{index}", at=5_000 + index)
        assert _delta(before, FILE_READS.snapshot()) == {}
        assert opener.opens == {}
        assert _indexed(root) == _scanned(root, compression)
    rows, heads = await _filtered(root, compression, {"P"})
    assert rows == [f"s{index:04d}" for index in range(20)] + [f"new{index}" for index in range(10)]
    assert heads == 30
    assert rows == await _expected(root, compression, {"P"})


async def test_a_foreign_session_folder_made_during_a_creation_makes_the_writer_read_the_folder(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process adds a session folder between the two `lstat`s: the link count shows it, the folder is read."""
    root = tmp_path / "sessions"
    await _crowded(root, compression, 30, 5)
    writer = make_writer(root, compression)
    make_dirs = backend_module.make_dirs

    def racing(directory: str) -> list[str]:
        created = make_dirs(directory)
        _foreign(writer, "foreign")
        return created

    monkeypatch.setattr(backend_module, "make_dirs", racing)
    async with running(make_backend(root, compression)) as (_, store):
        before = FILE_READS.snapshot().get("folder", 0)
        await _create(store, "mine")
        assert FILE_READS.snapshot().get("folder", 0) - before == 1
        assert _indexed(root) == _scanned(root, compression)
    rows, heads = await _filtered(root, compression, {"P"})
    assert {"foreign", "mine"} <= set(rows)
    assert heads == len(rows) == 7
    assert rows == await _expected(root, compression, {"P"})


async def test_what_the_checks_cannot_see_during_a_creation_is_in_the_index_after_close(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change no check sees (here: link counts ignored) is missing from the index until the store closes."""
    root = tmp_path / "sessions"
    await _crowded(root, compression, 30, 5)
    writer = make_writer(root, compression)
    make_dirs = backend_module.make_dirs

    def racing(directory: str) -> list[str]:
        created = make_dirs(directory)
        _foreign(writer, "unseen")
        return created

    monkeypatch.setattr(backend_module, "make_dirs", racing)
    monkeypatch.setattr(listing_module, "_only_one_added", lambda pre, post: post.st_mtime_ns != pre.st_mtime_ns)
    async with running(make_backend(root, compression)) as (_, store):
        await _create(store, "mine")
        assert "unseen" not in _indexed(root)  # the documented window, while the creating store is open
    assert _indexed(root) == _scanned(root, compression)
    rows, heads = await _filtered(root, compression, {"P"})
    assert {"unseen", "mine"} <= set(rows)
    assert heads == len(rows) == 7
    assert rows == await _expected(root, compression, {"P"})


async def test_a_creation_after_a_foreign_session_in_the_same_tick_leaves_the_folder_racily_clean(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A foreign session in the tick of the index write, then a dsh creation there: readers still read the folder.

    The index is written at tick `T` with the folder at `T` (racily clean); another writer adds a
    session and the folder's time is `T` again, so the creation finds the index describing the
    folder as it was just before. The stamp it appends stays racily clean, so a reader scans the
    folder and finds both sessions; the creating store's close reads the folder again and makes
    the index fresh, with both.
    """
    root = tmp_path / "sessions"
    await _crowded(root, compression, 30, 5)
    folder = root / project_key(FOLDER)
    tick = os.lstat(folder).st_mtime_ns + 5_000_000_000
    os.utime(folder, ns=(tick, tick))
    monkeypatch.setattr(index_module.Writer, "stamp", lambda self: tick)
    async with running(make_backend(root, compression)):
        pass  # a writing open re-indexes the folder "at tick T"
    monkeypatch.undo()
    writer = make_writer(root, compression)
    header = stored_header("same-tick", created_at=8_000, cwd=FOLDER, parentSession="P", origin="subagent")
    await writer.write("same-tick", header, closed_records(1))
    os.utime(folder, ns=(tick, tick))
    async with running(make_backend(root, compression)) as (_, store):
        await _create(store, "mine")
        view = IndexFiles(f"{root}.index", writable=False).load()
        assert view is not None
        assert view.stamps[folder.name].racy()
        assert "same-tick" not in view.folder_entries(folder.name)
        rows, heads = await _filtered(root, compression, {"P"})
        assert {"same-tick", "mine"} <= set(rows)
        assert heads == len(os.listdir(folder))  # the racily clean folder was scanned
        assert rows == await _expected(root, compression, {"P"})
    assert _indexed(root) == _scanned(root, compression)
    rows, heads = await _filtered(root, compression, {"P"})
    assert {"same-tick", "mine"} <= set(rows)
    assert heads == len(rows) == 7
