"""JSONL listing and lookup: header-only reads, damaged rows, detectors, duplicates, revisions.

Listing must stay cheap with many large logs, so it reads each file's head and a bounded tail and
never decodes events (docs/storage-format.md#header-record, docs/storage-format.md#revisions).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from dsh.persistence.errors import SessionAlreadyExistsError, SessionCorruptionError, StoreMisconfiguredError
from dsh.persistence.jsonl import JsonlBackend, encode_batch, encode_header
from dsh.session import HeaderInit
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import append_note, stored_header
from tests.persistence.helpers import CountingOpener, closed_records, make_backend, make_writer, running


async def test_listing_survives_damage_of_every_kind(tmp_path: Path, compression: str) -> None:
    """Damaged events and 8 KiB+ headers list; empty and incomplete heads and a bad header are damaged."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("damaged", stored_header("damaged", created_at=1), closed_records(1))
    await writer.damage_events("damaged")
    await writer.write("big", stored_header("big", created_at=2, agentPreset="p" * 9000), closed_records(1))
    await writer.write("fine", stored_header("fine", created_at=3), closed_records(1))
    await writer.write_bytes("empty", b"")
    incomplete = writer.frame(encode_header(stored_header("incomplete")))
    incomplete = incomplete[:-4] if compression == "zstd" else incomplete[:-1]
    await writer.write_bytes("incomplete", incomplete)
    await writer.write("invalid", {"type": "session", "version": 0, "id": "invalid", "createdAt": -5}, [])
    async with running(make_backend(root, compression)) as (coordinator, _):
        listing = await coordinator.list()
        assert [row.header.id for row in listing] == ["damaged", "big", "fine"]
        assert listing.rows[1].header.agent_preset == "p" * 9000
        damaged = sorted((d.location, d.code, d.session_id) for d in listing.damaged)
        assert damaged == sorted(
            (writer.path_of(session_id), "SESSION_CORRUPT", session_id)
            for session_id in ("empty", "incomplete", "invalid")
        )
        reasons = {d.session_id: d.message for d in listing.damaged}
        assert writer.path_of("invalid") in reasons["invalid"]
        assert "the log is empty (0 bytes)" in reasons["empty"]
        assert "the header) is incomplete" in reasons["incomplete"]


async def test_one_id_in_two_projects_is_reported_and_left_out(tmp_path: Path, compression: str) -> None:
    """One id in two project directories: both paths damaged (`SESSION_CORRUPT`), others listed."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("twin", stored_header("twin", cwd="/a"), closed_records(1))
    first = writer.path_of("twin")
    await writer.write("other", stored_header("other", cwd="/b"), closed_records(1))
    second = writer.path_for("twin", cwd="/b")
    os.makedirs(os.path.dirname(second))
    Path(second).write_bytes(writer.encode(stored_header("twin", cwd="/b"), closed_records(1)))
    async with running(make_backend(root, compression)) as (coordinator, _):
        listing = await coordinator.list()
        assert [row.header.id for row in listing] == ["other"]
        assert sorted(d.location for d in listing.damaged) == sorted([first, second])
        assert {d.code for d in listing.damaged} == {"SESSION_CORRUPT"}
        assert all("duplicate session id" in d.message for d in listing.damaged)
        with pytest.raises(SessionCorruptionError, match="duplicate session id"):
            await coordinator.inspect("twin")


async def test_a_root_holding_both_encodings_reads_each_log_in_its_own(tmp_path: Path, compression: str) -> None:
    """Each log is read, listed and appended to in the encoding its file name says; new logs take the
    configured one."""
    root = tmp_path / "sessions"
    other = "none" if compression == "zstd" else "zstd"
    await make_writer(root, compression).write("mine", stored_header("mine", created_at=1), closed_records(1))
    await make_writer(root, other).write("foreign", stored_header("foreign", created_at=2), closed_records(1))
    foreign = make_writer(root, other).path_of("foreign")
    async with running(make_backend(root, compression)) as (coordinator, store):
        assert [row.header.id for row in await coordinator.list()] == ["mine", "foreign"]
        assert len((await coordinator.inspect("foreign")).events) == len(closed_records(1))
        prepared = await coordinator.prepare("foreign")
        prepared.publish()
        append_note(prepared.session, 1)
        await store.flush(prepared.session)
        fresh = store.create("fresh", header=HeaderInit())
        append_note(fresh, 1)
        await store.flush(fresh)
    assert make_writer(root, other).path_of("foreign") == foreign
    assert (
        make_writer(root, compression)
        .path_of("fresh")
        .endswith("session.jsonl.zstd" if compression == "zstd" else "/session.jsonl")
    )
    raw = Path(foreign).read_bytes()
    assert raw.startswith(b"\x28\xb5\x2f\xfd") == (other == "zstd")  # the zstd frame magic, or plain lines
    async with running(make_backend(root, other)) as (coordinator, _):
        events = (await coordinator.inspect("foreign")).events
        assert [e.type for e in events[len(closed_records(1)) :]] == ["session/end-seed", "session/title"]
        assert [row.header.id for row in await coordinator.list()] == ["mine", "foreign", "fresh"]


async def test_a_session_folder_holding_both_logs_is_damaged_not_guessed(tmp_path: Path, compression: str) -> None:
    """`session.jsonl` beside `session.jsonl.zstd` is `SESSION_CORRUPT` for that session only; the rest lists."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("fine", stored_header("fine"), closed_records(1))
    await writer.write("twin", stored_header("twin"), closed_records(1))
    other = "none" if compression == "zstd" else "zstd"
    second = writer.path_for("twin", compression=other)  # type: ignore[arg-type]
    Path(second).write_bytes(writer.encode(stored_header("twin"), closed_records(1), compression=other))  # type: ignore[arg-type]
    folder = os.path.dirname(second)
    async with running(make_backend(root, compression)) as (coordinator, _):
        listing = await coordinator.list()
        assert [row.header.id for row in listing] == ["fine"]
        assert [(d.location, d.code, d.session_id) for d in listing.damaged] == [(folder, "SESSION_CORRUPT", "twin")]
        assert "holds both session.jsonl.zstd and session.jsonl" in listing.damaged[0].message
        with pytest.raises(SessionCorruptionError, match="holds both"):
            await coordinator.inspect("twin")


async def test_flat_legacy_file_is_misconfigured(tmp_path: Path, compression: str) -> None:
    """A flat legacy `<project>/<id>.jsonl[.zstd]` makes open, listing and lookup `STORE_MISCONFIGURED`."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("fine", stored_header("fine"), closed_records(1))
    await writer.write_flat("legacy", stored_header("legacy"), closed_records(1))
    backend = make_backend(root, compression)
    with pytest.raises(StoreMisconfiguredError, match="flat legacy layout"):
        await backend.open()
    with pytest.raises(StoreMisconfiguredError):
        await backend.list_headers()
    with pytest.raises(StoreMisconfiguredError):
        await backend.load("legacy")


async def test_materialize_refuses_an_id_stored_in_the_other_encoding(tmp_path: Path) -> None:
    """A new session whose id is stored as `session.jsonl` is refused as already existing, never written beside it."""
    root = tmp_path / "sessions"
    await JsonlLogWriter(root, compression="none").write("s1", stored_header("s1"), closed_records(1))
    backend = JsonlBackend(root)
    header = stored_header("s1")
    with pytest.raises(SessionAlreadyExistsError):
        await backend.append_batch(header, [], materialized=False, fence=None)  # type: ignore[arg-type]
    assert JsonlLogWriter(root).find("s1") == [JsonlLogWriter(root, compression="none").path_for("s1")]


async def test_parent_filter_and_sort_order(tmp_path: Path, compression: str) -> None:
    """`list(parent_session=p)` keeps direct children only, sorted by `(created_at, id)`."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    for session_id, created, parent in (("c2", 5, "p"), ("c1", 5, "p"), ("c0", 9, "p"), ("x", 1, "q"), ("p", 0, None)):
        await writer.write(session_id, stored_header(session_id, created_at=created, parentSession=parent), [])
    async with running(make_backend(root, compression)) as (coordinator, _):
        assert [row.header.id for row in await coordinator.list(parent_session="p")] == ["c1", "c2", "c0"]
        assert [row.header.id for row in await coordinator.list()] == ["p", "x", "c1", "c2", "c0"]


async def test_revisions_agree_across_read_paths_and_change_on_append(tmp_path: Path, compression: str) -> None:
    """list, inspect, revision and read_events report one revision; an append changes it."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("s1"), closed_records(1))
    async with running(make_backend(root, compression)) as (coordinator, _):
        (row,) = (await coordinator.list()).rows
        observation = await coordinator.inspect("s1")
        revision = await coordinator.revision("s1")
        sliced = await coordinator.read_events("s1")
        assert row.revision == observation.revision == revision == sliced.revision
        await writer.append("s1", closed_records(2)[6:])
        changed = await coordinator.revision("s1")
        assert changed != revision
        assert (await coordinator.inspect("s1")).revision == changed
        assert len((await coordinator.inspect("s1")).events) == 12


async def test_revision_changes_after_a_same_size_rewrite(tmp_path: Path) -> None:
    """A rewrite that keeps the size still changes the revision (the last 4 KiB are hashed)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = closed_records(1)
    await writer.write("s1", stored_header("s1"), records)
    backend = make_backend(root, "none")
    before = await backend.read_revision("s1")
    path = Path(writer.path_of("s1"))
    stat = path.stat()
    data = path.read_bytes().replace(b'"hello"', b'"hallo"')
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert await backend.read_revision("s1") != before


async def test_two_stores_with_identical_content_never_share_a_revision(tmp_path: Path) -> None:
    """Identical logs in two roots have different revisions (device/inode differ)."""
    revisions = []
    for name in ("a", "b"):
        writer = make_writer(tmp_path / name, "zstd")
        await writer.write("s1", stored_header("s1"), closed_records(1))
        revisions.append(await make_backend(tmp_path / name, "zstd").read_revision("s1"))
    assert revisions[0] != revisions[1]


async def test_lookup_cache_follows_a_moved_session(tmp_path: Path) -> None:
    """The in-process id -> path cache is verified on use: a log moved to another project is found again."""
    root = tmp_path / "sessions"
    backend = make_backend(root, "zstd")
    async with running(backend) as (coordinator, store):
        session = store.create("s1", header=HeaderInit(cwd="/a"))
        append_note(session, 0)
        await store.flush(session)
        store.dispose(session)
        await coordinator.drain("s1")
    writer = make_writer(root, "zstd")
    old = writer.path_of("s1")
    await writer.write("s1", stored_header("s1", cwd="/b"), [])
    assert not os.path.exists(old)
    reopened = make_backend(root, "zstd")
    assert await reopened.exists("s1")
    log = await reopened.load("s1")
    assert log is not None
    assert log.location == writer.path_of("s1")


@pytest.mark.slow
async def test_listing_reads_only_header_frames(tmp_path: Path) -> None:
    """Listing 1,000 sessions opens each log once and reads a bounded head + tail, never the events."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    body = writer.frame(encode_batch(closed_records(8)))  # one pre-compressed event frame, copied
    large = body * 60
    assert len(large) > 40_000

    def build() -> None:
        for index in range(1000):
            session_id = f"s{index:04d}"
            path = writer.path_for(session_id)
            os.makedirs(os.path.dirname(path))
            data = writer.frame(encode_header(stored_header(session_id, created_at=index)))
            Path(path).write_bytes(data + (large if index % 2 else body))

    await asyncio.to_thread(build)
    opener = CountingOpener()
    backend = JsonlBackend(root, opener=opener)
    rows, damaged = await backend.list_headers()
    assert (len(rows), damaged) == (1000, [])
    assert len(opener.opens) == 1000
    assert set(opener.opens.values()) == {1}
    small = [opener.bytes_read[writer.path_for(f"s{i:04d}")] for i in range(0, 1000, 2)]
    big = [opener.bytes_read[writer.path_for(f"s{i:04d}")] for i in range(1, 1000, 2)]
    assert max(big) <= 8192 + 4096
    assert max(big) - min(big) == 0
    assert sum(big) < 1000 * len(large) // 5
    assert max(small) <= 8192 + 4096
    await backend.close()


async def test_listing_omits_a_log_deleted_after_discovery(tmp_path: Path) -> None:
    """A session directory without a transcript is skipped (a log deleted between walk and read)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    await writer.write("gone", stored_header("gone"), closed_records(1))
    await writer.write("kept", stored_header("kept"), closed_records(1))
    os.unlink(writer.path_of("gone"))
    rows, damaged = await make_backend(root, "zstd").list_headers()
    assert [row.record["id"] for row in rows] == ["kept"]
    assert damaged == []


async def test_unreadable_log_is_reported_without_failing_the_listing(tmp_path: Path) -> None:
    """A log that cannot be read is reported in `damaged` (`PERSISTENCE_IO`); the other sessions still list."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    await writer.write("bad", stored_header("bad"), closed_records(1))
    await writer.write("good", stored_header("good"), closed_records(1))
    bad = writer.path_of("bad")

    def opener(path: str, mode: str) -> Any:
        if path == bad:
            raise PermissionError(13, "Permission denied", path)
        return open(path, mode)  # the backend closes it

    rows, damaged = await JsonlBackend(root, opener=opener).list_headers()
    assert [row.record["id"] for row in rows] == ["good"]
    assert [(d.location, d.code) for d in damaged] == [(bad, "PERSISTENCE_IO")]
