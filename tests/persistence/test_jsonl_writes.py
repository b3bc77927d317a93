"""JSONL writes: atomic materialization, all-or-nothing appends with rollback, seq checks, repairs.

A batch either lands whole or leaves the file as it was, so a retry never stores a seq twice
(docs/storage-format.md#durability, docs/storage-format.md#torn-tails-and-repair).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from dsh.json import FrozenDict
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import (
    AppendConflictError,
    LeaseHeldError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    SessionCorruptionError,
)
from dsh.persistence.jsonl import JsonlBackend
from dsh.session import HeaderInit, SessionEvent, SessionStore
from dsh.testing.faulty import FaultyBackend
from dsh.testing.io_faults import io_fault
from dsh.testing.stored_logs import append_closed_turn, append_note, stored_header
from tests.persistence.helpers import closed_records, make_backend, make_writer, open_step_records, running


def _events(records: list[dict[str, Any]]) -> list[SessionEvent]:
    return [SessionEvent(record) for record in records]


def _seqs(path: str, compression: str) -> list[int]:
    data = Path(path).read_bytes()
    if compression == "zstd":
        import zstandard

        data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    return [orjson.loads(line)["seq"] for line in data.splitlines()[1:]]


def _temps(root: Path) -> list[Path]:
    return list(root.rglob("*.tmp"))


async def test_concurrent_materializations_one_wins(tmp_path: Path, compression: str) -> None:
    """Two concurrent materializations: one wins, the other gets `SESSION_ALREADY_EXISTS`, no temp left."""
    root = tmp_path / "sessions"
    header = FrozenDict(stored_header("s1", cwd="/w"))
    events = _events(closed_records(1))
    for _ in range(5):
        backends = [make_backend(root, compression) for _ in range(2)]
        results = await asyncio.gather(
            *(b.append_batch(header, events, materialized=False, fence=None) for b in backends),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        assert len(failures) == 1
        assert isinstance(failures[0], SessionAlreadyExistsError)
        assert _temps(root) == []
        path = backends[0].locate(header)
        assert path is not None
        assert _seqs(path, compression) == list(range(6))
        os.unlink(path)


async def test_materialize_refuses_an_id_stored_elsewhere(tmp_path: Path) -> None:
    """Materializing an id already stored under another project directory is `SESSION_ALREADY_EXISTS`."""
    root = tmp_path / "sessions"
    await make_writer(root, "zstd").write("s1", stored_header("s1", cwd="/a"), closed_records(1))
    backend = make_backend(root, "zstd")
    header = FrozenDict(stored_header("s1", cwd="/b"))
    with pytest.raises(SessionAlreadyExistsError, match="already exists on disk"):
        await backend.append_batch(header, _events(closed_records(1)), materialized=False, fence=None)


@pytest.mark.parametrize("kind", ["partial", "sync"])
async def test_failed_append_rolls_back_and_retry_has_no_duplicate(tmp_path: Path, compression: str, kind: str) -> None:
    """A write or fsync failure mid-append restores the previous size; the retry stores each seq once."""
    root = tmp_path / "sessions"
    faulty = FaultyBackend(make_backend(root, compression))
    async with running(faulty) as (_, store):
        session = store.create("s1")
        append_closed_turn(session, 0)
        await store.flush(session)
        path = faulty.locate(session.header.to_stored(0))
        assert path is not None
        size = Path(path).stat().st_size
        append_closed_turn(session, 1)
        if kind == "partial":
            faulty.fail_next_append(partial=True)
        else:
            faulty.fail_next_sync()
        with pytest.raises(PersistenceIOError):
            await store.flush(session)
        assert Path(path).stat().st_size == size
        await store.flush(session)
        assert _seqs(path, compression) == list(range(12))


async def test_failed_rollback_names_the_path(tmp_path: Path, compression: str) -> None:
    """When the rollback fails too, `PersistenceIOError` names the artifact; prepare later repairs the tail."""
    root = tmp_path / "sessions"
    faulty = FaultyBackend(make_backend(root, compression))
    store = SessionStore()
    coordinator = PersistenceCoordinator(faulty, store)
    await coordinator.open()
    session = store.create("s1")
    append_closed_turn(session, 0)
    await store.flush(session)
    path = faulty.locate(session.header.to_stored(0))
    append_closed_turn(session, 1)
    faulty.fail_next_rollback()
    with pytest.raises(PersistenceIOError, match="failed to roll back append to") as caught:
        await store.flush(session)
    error = caught.value
    assert error.location == path
    assert isinstance(error.__cause__, ExceptionGroup)
    assert len(error.__cause__.exceptions) == 2
    # The half-written batch is now a torn tail: further appends are refused, so closing fails loudly.
    await store.aclose()
    with pytest.raises(ExceptionGroup):
        await coordinator.close()
    async with running(make_backend(root, compression)) as (fresh, _):
        async with await fresh.prepare("s1"):
            pass
        repaired = await fresh.inspect("s1")
        assert repaired.synthetic_tail == 0
        assert [event.seq for event in repaired.events] == list(range(len(repaired.events)))
        assert list(repaired.events[:6]) == list(session.events[:6])
        assert repaired.events[-1].type == "turn/end"


async def test_failed_materialization_leaves_nothing(tmp_path: Path, compression: str) -> None:
    """A fault while writing the first batch leaves neither a transcript nor a temp file; the retry materializes."""
    root = tmp_path / "sessions"
    backend = make_backend(root, compression)
    header = FrozenDict(stored_header("s1"))
    events = _events(closed_records(1))
    with io_fault(backend, "partial-write", PersistenceIOError("injected")) as shot:
        with pytest.raises(PersistenceIOError, match="injected"):
            await backend.append_batch(header, events, materialized=False, fence=None)
    assert shot.struck
    assert not await backend.exists("s1")
    assert _temps(root) == []
    await backend.append_batch(header, events, materialized=False, fence=None)
    assert await backend.exists("s1")


async def test_seq_mismatch_is_refused_before_writing(tmp_path: Path, compression: str) -> None:
    """A batch not starting at the stored next seq is `APPEND_SEQ_MISMATCH`; the revision is unchanged."""
    root = tmp_path / "sessions"
    backend = make_backend(root, compression)
    header = FrozenDict(stored_header("s1"))
    records = closed_records(2)
    await backend.append_batch(header, _events(records[:5]), materialized=False, fence=None)
    revision = await backend.read_revision("s1")
    for first in (4, 6):
        with pytest.raises(AppendConflictError) as caught:
            await backend.append_batch(header, _events(records[first : first + 2]), materialized=True, fence=None)
        assert caught.value.code == "APPEND_SEQ_MISMATCH"
    assert await backend.read_revision("s1") == revision
    await backend.append_batch(header, _events(records[5:]), materialized=True, fence=None)


async def test_append_after_an_external_append_rescans(tmp_path: Path, compression: str) -> None:
    """An append after another writer grew the log learns the new next seq (stale batches are refused)."""
    root = tmp_path / "sessions"
    backend = make_backend(root, compression)
    header = FrozenDict(stored_header("s1"))
    records = closed_records(3)
    await backend.append_batch(header, _events(records[:6]), materialized=False, fence=None)
    await make_writer(root, compression).append("s1", records[6:12])
    with pytest.raises(AppendConflictError):
        await backend.append_batch(header, _events(records[6:12]), materialized=True, fence=None)
    await backend.append_batch(header, _events(records[12:]), materialized=True, fence=None)
    log = await backend.load("s1")
    assert log is not None
    assert log.events == records


async def test_append_to_a_torn_log_is_refused(tmp_path: Path) -> None:
    """An append never lands behind a torn tail: the log must be repaired by `prepare` first."""
    root = tmp_path / "sessions"
    backend = make_backend(root, "none")
    header = FrozenDict(stored_header("s1"))
    records = open_step_records()
    await backend.append_batch(header, _events(records[:-1]), materialized=False, fence=None)
    await make_writer(root, "none").append_bytes("s1", b'{"torn":')
    with pytest.raises(SessionCorruptionError, match="torn tail"):
        await backend.append_batch(header, _events(records[-1:]), materialized=True, fence=None)


async def test_repair_is_idempotent_after_a_crash_between_its_steps(tmp_path: Path) -> None:
    """A crash after the truncation but before the closers leaves a log the next prepare repairs again."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    records = open_step_records()
    await writer.write("s1", stored_header("s1"), records)
    await writer.append_bytes("s1", b"\x28\xb5\x2f")
    clean = Path(writer.path_of("s1")).read_bytes()[:-3]
    backend = make_backend(root, "zstd")
    log = await backend.load("s1")
    assert log is not None
    assert log.torn is not None
    # Simulate "step 1 committed, step 2 lost": only the truncation reached the disk.
    await writer.truncate("s1", log.torn.truncate_to)
    assert Path(writer.path_of("s1")).read_bytes() == clean
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        async with await coordinator.prepare("s1") as prepared:
            assert prepared.observation.synthetic_tail == 0
        observation = await coordinator.inspect("s1")
        assert [event.type for event in observation.events][-2:] == ["step/end", "turn/end"]
        assert observation.synthetic_tail == 0


async def test_repair_refuses_a_log_changed_since_it_was_read(tmp_path: Path) -> None:
    """`commit_repair` with a torn marker that no longer matches the file is refused before writing."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    await writer.write("s1", stored_header("s1"), open_step_records())
    await writer.append_bytes("s1", b'{"torn":')
    backend = make_backend(root, "none")
    log = await backend.load("s1")
    assert log is not None
    assert log.torn is not None
    await writer.write("s1", stored_header("s1"), open_step_records())  # torn tail gone meanwhile
    before = Path(writer.path_of("s1")).read_bytes()
    with pytest.raises(AppendConflictError, match="changed since it was read"):
        await backend.commit_repair(FrozenDict(log.header), log.torn, [], fence=None)
    assert Path(writer.path_of("s1")).read_bytes() == before


async def test_writer_lock_is_taken_at_materialization_and_prepare(tmp_path: Path) -> None:
    """A second backend instance cannot prepare a session whose first writer is live (`SESSION_LEASE_HELD`)."""
    root = tmp_path / "sessions"
    async with running(make_backend(root, "zstd")) as (_, store):
        session = store.create("s1", header=HeaderInit(cwd="/w"))
        append_note(session, 0)
        await store.flush(session)
        async with running(make_backend(root, "zstd")) as (other, _):
            with pytest.raises(LeaseHeldError) as caught:
                await other.prepare("s1")
            assert caught.value.code == "SESSION_LEASE_HELD"
            assert caught.value.holder is not None
            assert str(os.getpid()) in caught.value.holder
        store.dispose(session)
    async with running(make_backend(root, "zstd")) as (other, _):
        async with await other.prepare("s1") as prepared:
            assert prepared.session.id == "s1"


async def test_rejects_header_without_usable_identity(tmp_path: Path) -> None:
    """Materializing a header whose id cannot name an artifact is refused without writing."""
    backend = JsonlBackend(tmp_path / "sessions")
    with pytest.raises(SessionCorruptionError):
        await backend.append_batch(FrozenDict({"id": 5}), [], materialized=False, fence=None)
    assert not (tmp_path / "sessions").exists()
