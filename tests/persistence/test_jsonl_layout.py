"""JSONL backend layout, framing and housekeeping: paths, frames per batch, modes, temp sweep, root checks.

These run the real backend under a coordinator and look at the files it leaves
(docs/storage-format.md#jsonl-layout, docs/storage-format.md#zstd-frames).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest
import zstandard

from dsh.errors import ConfigError
from dsh.persistence.base import Capability
from dsh.persistence.errors import PersistenceClosedError, StoreMisconfiguredError
from dsh.persistence.jsonl import JsonlBackend
from dsh.session import HeaderInit
from dsh.testing.jsonl_writer import frame_spans
from dsh.testing.stored_logs import append_closed_turn, append_note, stored_header
from tests.persistence.helpers import closed_records, make_backend, make_writer, running


def _files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


async def test_flushed_session_lands_at_the_escaped_path(tmp_path: Path, compression: str) -> None:
    """id `a/b c~` with cwd `/srv/x y` is stored at the escaped project/id path."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, compression)) as (coordinator, store):
        session = store.create("a/b c~", header=HeaderInit(cwd="/srv/x y"))
        append_closed_turn(session, 0)
        await store.flush(session)
        expected = root / "--srv-x~0020y--" / "a~002Fb~0020c~007E"
        name = "session.jsonl.zstd" if compression == "zstd" else "session.jsonl"
        assert _files(root) == [expected / name]
        assert coordinator.locate(session.header) == str(expected / name)


async def test_traversal_id_without_cwd_stays_inside_the_root(tmp_path: Path) -> None:
    """id `..` without cwd is stored under `_no-cwd/~002E~002E/` inside the root."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, "zstd")) as (_, store):
        session = store.create("..")
        append_note(session, 0)
        await store.flush(session)
    assert _files(root) == [root / "_no-cwd" / "~002E~002E" / "session.jsonl.zstd"]
    assert not (tmp_path / "session.jsonl.zstd").exists()


async def test_materializes_lazily_with_one_frame_per_batch(tmp_path: Path) -> None:
    """Nothing exists before the first flush; it writes two frames; each later batch adds one frame."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, "zstd")) as (_, store):
        session = store.create("s1", header=HeaderInit(cwd="/w"))
        append_closed_turn(session, 0)
        assert not root.exists()
        await store.flush(session)
        path = root / "--w--" / "s1" / "session.jsonl.zstd"
        first = path.read_bytes()
        spans = frame_spans(first)
        assert len(spans) == 2
        assert spans[-1][1] == len(first)
        header_text = zstandard.ZstdDecompressor().decompressobj().decompress(first[: spans[0][1]])
        assert header_text.count(b"\n") == 1
        assert orjson.loads(header_text)["id"] == "s1"
        for turn in (1, 2):
            before = path.read_bytes()
            append_closed_turn(session, turn)
            await store.flush(session)
            after = path.read_bytes()
            assert after.startswith(before)
            assert len(frame_spans(after)) == len(frame_spans(before)) + 1


async def test_raw_batches_only_append_lines(tmp_path: Path) -> None:
    """Plain JSONL: the first flush writes the header line plus the batch; later batches only append lines."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, "none")) as (_, store):
        session = store.create("s1")
        append_closed_turn(session, 0)
        await store.flush(session)
        path = root / "_no-cwd" / "s1" / "session.jsonl"
        before = path.read_bytes()
        assert before.count(b"\n") == 1 + 6
        append_closed_turn(session, 1)
        await store.flush(session)
        after = path.read_bytes()
        assert after.startswith(before)
        assert after.count(b"\n") == 1 + 12


async def test_standard_decoder_reads_the_multi_frame_file(tmp_path: Path) -> None:
    """`zstandard` with `read_across_frames=True` decodes the file; the header keeps upstream order."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, "zstd")) as (_, store):
        session = store.create("s1", header=HeaderInit(cwd="/w", agent_preset="coder"))
        append_closed_turn(session, 0)
        await store.flush(session)
        append_closed_turn(session, 1)
        await store.flush(session)
        events = list(session.events)
    data = (root / "--w--" / "s1" / "session.jsonl.zstd").read_bytes()
    text = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    lines = text.splitlines()
    assert list(orjson.loads(lines[0])) == [
        "type",
        "version",
        "id",
        "createdAt",
        "cwd",
        "delegationDepth",
        "agentPreset",
    ]
    assert lines[1:] == [orjson.dumps(event) for event in events]
    assert text.endswith(b"\n")


async def test_files_are_0600_and_directories_0700(tmp_path: Path, compression: str) -> None:
    """Created directories are 0700 and transcripts 0600; no temp file is left behind."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, compression)) as (_, store):
        session = store.create("s1", header=HeaderInit(cwd="/w"))
        append_note(session, 0)
        await store.flush(session)
    for directory in (root, root / "--w--", root / "--w--" / "s1"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    (path,) = _files(root)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.name.endswith(".tmp")


def test_locate_needs_no_io(tmp_path: Path) -> None:
    """`locate` computes the artifact path from id + cwd without touching the file system."""
    backend = JsonlBackend(tmp_path / "missing" / "root")
    path = backend.locate(stored_header("x y", cwd="/a"))
    assert path == str(tmp_path / "missing" / "root" / "--a--" / "x~0020y" / "session.jsonl.zstd")
    assert backend.locate({"id": 5}) is None
    assert not (tmp_path / "missing").exists()


def test_capabilities_and_name() -> None:
    """The JSONL backend declares artifact paths and eager appends, no typed reads (it reads whole logs)."""
    backend = JsonlBackend("relative/root")
    assert backend.capabilities == frozenset({Capability.ARTIFACT_PATHS, Capability.EAGER_APPENDS})
    assert backend.root.is_absolute()


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"compression": "gzip"}, "compression"),
        ({"zstd_level": 0}, "zstd_level"),
        ({"zstd_level": True}, "zstd_level"),
        ({"opener": 5}, "opener"),
    ],
)
def test_invalid_configuration_is_refused(tmp_path: Path, kwargs: dict[str, object], text: str) -> None:
    """Invalid constructor values raise `ConfigError` (`CONFIG_INVALID`)."""
    with pytest.raises(ConfigError, match=text) as caught:
        JsonlBackend(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert caught.value.code == "CONFIG_INVALID"


async def test_root_that_is_a_file_is_misconfigured(tmp_path: Path) -> None:
    """An existing root that is not a directory is `STORE_MISCONFIGURED` at open and at every listing."""
    root = tmp_path / "sessions"
    root.write_text("oops")
    backend = JsonlBackend(root)
    with pytest.raises(StoreMisconfiguredError) as caught:
        await backend.open()
    assert caught.value.code == "STORE_MISCONFIGURED"
    with pytest.raises(StoreMisconfiguredError):
        await backend.list_headers()


async def test_missing_root_is_fine_until_first_materialization(tmp_path: Path) -> None:
    """A missing root lists nothing, loads nothing, and is created (0700) by the first flush."""
    root = tmp_path / "deep" / "sessions"
    backend = JsonlBackend(root)
    await backend.open()
    assert await backend.list_headers() == ([], [])
    assert await backend.load("x") is None
    assert await backend.read_revision("x") is None
    assert not await backend.exists("x")
    await backend.close()
    assert not root.exists()


async def test_stale_temp_files_are_swept_at_open(tmp_path: Path, compression: str) -> None:
    """A `<final>.<12 hex>.tmp` left by a crash is removed at the next open; other files stay."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("s1"), closed_records(1))
    final = Path(writer.path_of("s1"))
    stale = final.with_name(final.name + ".0123456789ab.tmp")
    stale.write_bytes(b"half")
    unrelated = final.with_name("notes.tmp")
    unrelated.write_bytes(b"keep")
    backend = make_backend(root, compression)
    await backend.open()
    assert not stale.exists()
    assert unrelated.exists()
    assert final.exists()
    await backend.close()


async def test_temp_file_of_a_live_writer_is_not_swept(tmp_path: Path) -> None:
    """A temp file whose session lock is held by a writer is left alone (it may be about to be linked)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    await writer.write("s1", stored_header("s1"), closed_records(1))
    final = Path(writer.path_of("s1"))
    pending = final.with_name(final.name + ".abcdefabcdef.tmp")
    pending.write_bytes(b"in flight")
    holder = JsonlBackend(root)
    await holder.acquire("s1")
    other = JsonlBackend(root)
    await other.open()
    assert pending.exists()
    await holder.close()
    await other.close()


async def test_calls_after_close_are_refused(tmp_path: Path) -> None:
    """After `close()` every storage call raises `PERSISTENCE_CLOSED`; a second close is a no-op."""
    backend = JsonlBackend(tmp_path)
    await backend.open()
    await backend.close()
    await backend.close()
    with pytest.raises(PersistenceClosedError):
        await backend.load("x")
    with pytest.raises(PersistenceClosedError):
        await backend.list_headers()


async def test_root_path_never_escapes(tmp_path: Path) -> None:
    """Ids and cwds that look like traversal stay inside the root (every artifact is below it).

    The only files beside the root are the writer locks and the parent index, each flat in its folder.
    """
    root = tmp_path / "sessions"
    async with running(make_backend(root, "none")) as (_, store):
        for session_id, cwd in (("../../etc", "/../.."), ("a/../../b", "/x/../../y"), ("~", "/")):
            session = store.create(session_id, header=HeaderInit(cwd=cwd))
            append_note(session, 0)
            await store.flush(session)
    beside = {tmp_path / "sessions.locks", tmp_path / "sessions.index"}
    for path in _files(tmp_path):
        assert os.path.commonpath([root, path]) == str(root) or path.parent in beside
    assert len(_files(root)) == 3
