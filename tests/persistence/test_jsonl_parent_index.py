"""The JSONL parent index: a listing by parent reads the family's headers only, and never loses a row.

See docs/storage-format.md#parent-index: what the index holds, exactly what a reader checks before
it trusts it (the folder's device and modification time, and git's "racily clean" rule), who writes
it, and why a stale, damaged or missing index costs time but never a row.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsh.persistence.base import DamagedSession
from dsh.persistence.jsonl import FILE_READS, project_key
from dsh.persistence.jsonl import _index as index_module
from dsh.session import HeaderInit, SessionStore
from dsh.testing.stored_logs import append_note, stored_header
from tests.helpers import tree_snapshot
from tests.persistence.helpers import closed_records, make_backend, make_writer, running

FOLDERS = ("/work/alpha", "/work/beta", "/work/gamma")


async def _session(store: SessionStore, session_id: str, *, cwd: str, parent: str | None = None, at: int = 1) -> None:
    """Create `session_id` through the writer (materialized by the backend) and retire it."""
    session = store.create(
        session_id,
        header=HeaderInit(
            cwd=cwd,
            parent_session=parent,
            origin="subagent" if parent else None,
            delegation_depth=1 if parent else 0,
            created_at=at,
        ),
    )
    append_note(session, 0)
    await store.flush(session)
    store.dispose(session)


async def _home(root: Path, compression: str, *, per_folder: int = 6) -> None:
    """Parent `P` with children `c0`..`c3` spread over the folders, plus ordinary sessions."""
    async with running(make_backend(root, compression)) as (coordinator, store):
        await _session(store, "P", cwd=FOLDERS[0])
        for index in range(4):
            await _session(store, f"c{index}", cwd=FOLDERS[index % 3], parent="P", at=10 + index)
        for folder_index, cwd in enumerate(FOLDERS):
            for index in range(per_folder):
                await _session(store, f"s{folder_index}{index}", cwd=cwd, at=100 + index)
        await _session(store, "g0", cwd=FOLDERS[2], parent="c0", at=50)
        await coordinator.drain("g0")


def _heads() -> int:
    return FILE_READS.snapshot().get("head", 0)


async def _filtered(root: Path, compression: str, parents: Iterable[str | None]) -> tuple[list[str], list[str], int]:
    """A read-only listing by parent: (row ids, damaged locations, header files opened)."""
    backend = make_backend(root, compression, read_only=True)
    await backend.open()
    try:
        before = _heads()
        rows, damaged = await backend.list_headers(parents=frozenset(parents))
        return [row.record["id"] for row in rows], sorted(d.location for d in damaged), _heads() - before
    finally:
        await backend.close()


async def _everything(root: Path, compression: str) -> tuple[list[tuple[str, object]], list[DamagedSession]]:
    backend = make_backend(root, compression, read_only=True)
    await backend.open()
    try:
        rows, damaged = await backend.list_headers()
        return [(row.record["id"], row.record.get("parentSession")) for row in rows], damaged
    finally:
        await backend.close()


async def _expected(root: Path, compression: str, parents: set[str | None]) -> tuple[list[str], list[str]]:
    rows, damaged = await _everything(root, compression)
    return [session_id for session_id, parent in rows if parent in parents], sorted(d.location for d in damaged)


async def test_a_listing_by_parent_opens_only_the_familys_headers(tmp_path: Path, compression: str) -> None:
    """Children spread over three folders: four header files are opened, and the rows are the full listing's."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    rows, damaged, heads = await _filtered(root, compression, {"P"})
    assert (rows, damaged) == await _expected(root, compression, {"P"})
    assert rows == ["c0", "c1", "c2", "c3"]
    assert heads == 4
    assert (await _filtered(root, compression, {"c0", "c1"}))[::2] == (["g0"], 1)
    assert (await _filtered(root, compression, {"nobody"}))[::2] == ([], 0)


async def test_a_changed_folder_costs_a_scan_of_that_folder_only(tmp_path: Path, compression: str) -> None:
    """Touching one project folder makes the reader scan it (every header there), and no other folder."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    beta = root / project_key(FOLDERS[1])
    os.utime(beta)
    rows, damaged, heads = await _filtered(root, compression, {"P"})
    assert (rows, damaged) == await _expected(root, compression, {"P"})
    in_beta = len(os.listdir(beta))
    children_elsewhere = 3
    assert heads == in_beta + children_elsewhere


async def test_sessions_written_by_a_foreign_writer_are_found(tmp_path: Path, compression: str) -> None:
    """A log written straight into an indexed folder (no index update) changes the folder: it is scanned."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    writer = make_writer(root, compression)
    header = stored_header("late", cwd=FOLDERS[1], parentSession="P", origin="subagent", delegationDepth=1)
    await writer.write("late", header, closed_records(1))
    rows, damaged, _ = await _filtered(root, compression, {"P"})
    assert "late" in rows
    assert (rows, damaged) == await _expected(root, compression, {"P"})


async def test_a_damaged_or_foreign_index_file_is_ignored(tmp_path: Path, compression: str) -> None:
    """A flipped byte, a truncated file, garbage or a directory in its place: every folder is scanned, no error."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    path = Path(f"{root}.index") / "entries"
    good = path.read_bytes()
    expected = await _expected(root, compression, {"P"})
    middle = len(good) // 2
    damaged_files = [
        good[:middle] + bytes([good[middle] ^ 0x01]) + good[middle + 1 :],
        good[: len(good) // 3],
        b"\x00\xff garbage\n",
        b"",
    ]
    everything = sum(len(os.listdir(folder)) for folder in root.iterdir())
    for data in damaged_files:
        path.write_bytes(data)
        rows, damaged, heads = await _filtered(root, compression, {"P"})
        assert (rows, damaged) == expected
        assert heads == everything  # no index: every folder was scanned
    path.unlink()
    path.mkdir()
    rows, damaged, _ = await _filtered(root, compression, {"P"})
    assert (rows, damaged) == expected


async def test_a_read_only_listing_never_writes_the_index(tmp_path: Path, compression: str) -> None:
    """A read-only backend scans a stale folder but leaves `<root>.index` exactly as it was (or absent)."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    os.utime(root / project_key(FOLDERS[0]))
    before = tree_snapshot(f"{root}.index")
    await _filtered(root, compression, {"P"})
    await _everything(root, compression)
    assert tree_snapshot(f"{root}.index") == before
    writer = make_writer(tmp_path / "fresh", compression)
    await writer.write("x", stored_header("x"), closed_records(1))
    await _filtered(tmp_path / "fresh", compression, {None})
    assert not Path(f"{tmp_path / 'fresh'}.index").exists()


async def test_damaged_entries_are_reported_from_the_index_by_one_read_each(tmp_path: Path, compression: str) -> None:
    """A damaged entry is recorded and read again by every listing by parent: the count needs no scan."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("bad", {"type": "session", "version": 0, "id": "bad", "createdAt": -5}, [])
    await _home(root, compression)  # the writing open indexes the folder holding `bad`
    rows, damaged, heads = await _filtered(root, compression, {"P"})
    assert damaged == [writer.path_of("bad")]
    assert (rows, damaged) == await _expected(root, compression, {"P"})
    assert heads == 4 + 1


async def test_an_id_in_two_folders_stays_damaged_when_only_one_copy_is_a_child(
    tmp_path: Path, compression: str
) -> None:
    """Copies under P and under Q in two folders: listing P's children shows no row and both copies damaged."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    writer = make_writer(root, compression)
    await writer.write("twin", stored_header("twin", cwd=FOLDERS[0], parentSession="P"), closed_records(1))
    second = writer.path_for("twin", cwd=FOLDERS[1])
    os.makedirs(os.path.dirname(second))
    Path(second).write_bytes(writer.encode(stored_header("twin", cwd=FOLDERS[1], parentSession="Q"), closed_records(1)))
    async with running(make_backend(root, compression)):
        pass  # a writing open indexes both folders, the duplicate included
    rows, damaged, _ = await _filtered(root, compression, {"P"})
    assert "twin" not in rows
    assert damaged == sorted([writer.path_for("twin", cwd=FOLDERS[0]), second])
    assert (rows, damaged) == await _expected(root, compression, {"P"})


async def test_a_torn_append_leaves_that_folder_stale_and_the_rows_right(tmp_path: Path, compression: str) -> None:
    """Half an update line at the end of the index: the folder it concerned is scanned, nothing is lost."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    async with running(make_backend(root, compression)) as (_, store):
        await _session(store, "c9", cwd=FOLDERS[1], parent="P", at=99)
    path = Path(f"{root}.index") / "entries"
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    assert data[last : last + 2] == b"U\t"  # the update that added c9, appended
    path.write_bytes(data[: last + (len(data) - last) // 2])
    rows, damaged, _ = await _filtered(root, compression, {"P"})
    assert "c9" in rows
    assert (rows, damaged) == await _expected(root, compression, {"P"})


# --------------------------------------------------------------------------------------------------
# The freshness rule


def _stat(dev: int, mtime_ns: int) -> os.stat_result:
    return SimpleNamespace(st_dev=dev, st_mtime_ns=mtime_ns)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("recorded", "written", "now", "fresh"),
    [
        (100, 200, 100, True),  # unchanged, strictly older than the write
        (100, 200, 150, False),  # changed since
        (100, 100, 100, False),  # racily clean: same tick as the write
        (200, 100, 200, False),  # racily clean: the folder's time is after the write's
    ],
    ids=["unchanged", "changed", "same-tick", "later"],
)
def test_the_freshness_rule(recorded: int, written: int, now: int, fresh: bool) -> None:
    """Fresh iff same device, the folder's mtime equals the recorded one, and it is strictly older than the write."""
    stamp = index_module.Stamp(7, recorded, written)
    assert stamp.fresh(_stat(7, now)) is fresh
    assert stamp.fresh(_stat(8, now)) is False


_FOREIGN_WRITER = textwrap.dedent(
    """
    import sys
    from dsh.testing.jsonl_writer import JsonlLogWriter
    from dsh.testing.stored_logs import stored_header
    import asyncio
    root, compression, cwd = sys.argv[1:4]
    writer = JsonlLogWriter(root, compression=compression)
    header = stored_header("other-process", cwd=cwd, parentSession="P", origin="subagent", delegationDepth=1)
    data = {"title": "t", "messageSeqs": [], "source": {"kind": "user"}}
    asyncio.run(writer.write("other-process", header, [{"type": "session/title", "seq": 0, "time": 1, "data": data}]))
    """
)


@pytest.mark.slow
async def test_a_session_another_process_creates_in_the_same_tick_as_the_index_write_is_found(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process adds a session in the tick of the index write, so the folder's time stays the recorded one.

    On a filesystem whose clock ticks coarsely a folder changed after the index looked at it can
    keep the recorded time. Here the clock is pinned to one tick `T`: the index is written at `T`
    with the folder at `T`, another process (a writer that knows nothing of the index) creates a
    session, and the folder's time is `T` again. The modification time alone would trust the index;
    the racily-clean rule makes the reader scan the folder and find the session.
    """
    root = tmp_path / "sessions"
    await _home(root, compression)
    folder = root / project_key(FOLDERS[1])
    tick = os.lstat(folder).st_mtime_ns + 5_000_000_000
    os.utime(folder, ns=(tick, tick))
    monkeypatch.setattr(index_module.Writer, "stamp", lambda self: tick)
    async with running(make_backend(root, compression)):
        pass  # a writing open re-indexes the folder "at tick T"
    monkeypatch.undo()
    view = index_module.IndexFiles(f"{root}.index", writable=False).load()
    assert view is not None
    assert view.stamps[folder.name].mtime_ns == view.stamps[folder.name].written_ns == tick
    subprocess.run(
        [sys.executable, "-c", _FOREIGN_WRITER, str(root), compression, FOLDERS[1]],
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    os.utime(folder, ns=(tick, tick))  # the same tick: the folder's time did not move
    assert os.lstat(folder).st_mtime_ns == view.stamps[folder.name].mtime_ns
    assert "other-process" not in {name for _, name in view.children("P")}
    rows, damaged, _ = await _filtered(root, compression, {"P"})
    assert "other-process" in rows
    assert (rows, damaged) == await _expected(root, compression, {"P"})
    # Without the racily-clean rule the index would have been trusted and the session lost.
    monkeypatch.setattr(
        index_module.Stamp, "fresh", lambda self, st: st.st_dev == self.dev and st.st_mtime_ns == self.mtime_ns
    )
    assert "other-process" not in (await _filtered(root, compression, {"P"}))[0]


@pytest.mark.slow
async def test_writers_in_two_processes_keep_one_index(tmp_path: Path, compression: str) -> None:
    """A session another dsh process materializes is in the index it updated, and found without a scan."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    program = textwrap.dedent(
        """
        import asyncio, sys
        from dsh.persistence.coordinator import PersistenceCoordinator
        from dsh.persistence.jsonl import JsonlBackend
        from dsh.session import HeaderInit, SessionStore
        async def main(root, compression, cwd):
            store = SessionStore()
            async with PersistenceCoordinator(JsonlBackend(root, compression=compression), store):
                header = HeaderInit(cwd=cwd, parent_session="P", origin="subagent", delegation_depth=1, created_at=77)
                session = store.create("from-afar", header=header)
                session.append("session/title", {"title": "t", "messageSeqs": [], "source": {"kind": "user"}})
                await store.flush(session)
                await store.aclose()
        asyncio.run(main(*sys.argv[1:4]))
        """
    )
    subprocess.run(
        [sys.executable, "-c", program, str(root), compression, FOLDERS[2]],
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    rows, damaged, heads = await _filtered(root, compression, {"P"})
    assert rows == ["c0", "c1", "c2", "c3", "from-afar"]
    assert heads == 5
    assert (rows, damaged) == await _expected(root, compression, {"P"})


async def test_the_writing_open_forgets_removed_folders_and_reindexes_changed_ones(
    tmp_path: Path, compression: str
) -> None:
    """A removed folder leaves the index at the next writing open; a changed one is fresh again after it."""
    root = tmp_path / "sessions"
    await _home(root, compression)
    shutil.rmtree(root / project_key(FOLDERS[2]))
    writer = make_writer(root, compression)
    writer.remove("s10")
    async with running(make_backend(root, compression)):
        pass
    view = index_module.IndexFiles(f"{root}.index", writable=False).load()
    assert view is not None
    assert sorted(view.stamps) == sorted(folder.name for folder in root.iterdir())
    assert all(stamp.fresh(os.lstat(root / folder)) for folder, stamp in view.stamps.items())
    rows, damaged, heads = await _filtered(root, compression, {"P"})
    assert (rows, damaged) == await _expected(root, compression, {"P"})
    assert heads == len(rows) == 3  # c2 went with its folder


async def test_updates_carrying_many_entries_are_folded_into_the_searched_base(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once appended updates would carry more entries than the bound, the writer rewrites one base, rows unchanged."""
    bound = 5
    monkeypatch.setattr(index_module, "_MAX_UPDATE_ENTRIES", bound)
    root = tmp_path / "sessions"
    await _home(root, compression)
    view = index_module.IndexFiles(f"{root}.index", writable=False).load()
    assert view is not None
    assert view.update_entries <= bound
    rows, damaged, heads = await _filtered(root, compression, {"P"})
    assert (rows, damaged) == await _expected(root, compression, {"P"})
    assert (rows, heads) == (["c0", "c1", "c2", "c3"], 4)
