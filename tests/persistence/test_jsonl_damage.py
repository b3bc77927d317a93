"""The JSONL damage matrix: torn tails repaired only by `prepare`, corruption, refusals, untouched reads.

A torn tail is what a crash mid-append leaves. Reads report it and close the open turn in memory
only; `prepare`, which makes the caller the session's writer, cuts it and stores the closers
(docs/storage-format.md#torn-tails-and-repair). Damage inside the committed region is corruption
and is never repaired; formats this version cannot read are refusals, never corruption.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError, SessionNotFoundError
from dsh.persistence.jsonl import encode_batch
from dsh.testing.jsonl_writer import JsonlLogWriter, frame_spans
from dsh.testing.stored_logs import build_records, stored_header
from tests.helpers import tree_snapshot
from tests.persistence.helpers import (
    closed_records,
    make_backend,
    make_writer,
    open_step_records,
    running,
)


def _decode_lines(path: str) -> list[dict[str, Any]]:
    data = Path(path).read_bytes()
    if path.endswith(".zstd"):
        data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    return [orjson.loads(line) for line in data.splitlines()]


async def _read_paths(coordinator: Any, session_id: str) -> list[BaseException | None]:
    """Run every non-mutating read of one id, collecting outcomes (errors are expected for damage)."""
    outcomes: list[BaseException | None] = []
    for read in (coordinator.inspect, coordinator.read_events, coordinator.revision):
        try:
            await read(session_id)
            outcomes.append(None)
        except Exception as error:
            outcomes.append(error)
    await coordinator.list()
    return outcomes


# ---------------------------------------------------------------- torn tails


async def test_raw_fragment_is_kept_by_inspect_and_repaired_by_prepare(tmp_path: Path) -> None:
    """A raw final fragment stays on disk through inspect; prepare truncates it and appends closers."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = open_step_records(started=("call-1",))
    await writer.write("s1", stored_header("s1"), records)
    path = writer.path_of("s1")
    clean = Path(path).read_bytes()
    await writer.append_bytes("s1", b'{"type":"tool/result","seq":')
    async with running(make_backend(root, "none")) as (coordinator, _):
        before = tree_snapshot(root)
        observation = await coordinator.inspect("s1")
        assert tree_snapshot(root) == before
        assert observation.synthetic_tail == 3  # tool/result (outcome unknown), step/end, turn/end
        assert [event["seq"] for event in observation.events] == list(range(len(records) + 3))
        async with await coordinator.prepare("s1") as prepared:
            assert len(prepared.session.events) == len(records) + 3 + 1  # + the in-memory end-seed
    lines = _decode_lines(path)[1:]
    assert lines[: len(records)] == records
    assert [line["type"] for line in lines[len(records) :]] == ["tool/result", "step/end", "turn/end"]
    repaired = Path(path).read_bytes()
    assert repaired.startswith(clean)
    assert repaired.endswith(b"\n")
    async with running(make_backend(root, "none")) as (coordinator, _):
        again = await coordinator.inspect("s1")
        assert again.synthetic_tail == 0
        assert len(again.events) == len(records) + 3


async def test_raw_garbage_then_log_only_events_is_a_torn_tail(tmp_path: Path) -> None:
    """Raw garbage followed only by log-only events reads as a torn tail; prepare cuts it and keeps a copy."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = open_step_records(calls=())
    assert records[-1]["type"] == "assistant/chunk"
    await writer.write("s1", stored_header("s1"), records[:-1])
    tail = b"#garbage#\n" + encode_batch(records[-1:])
    await writer.append_bytes("s1", tail)
    async with running(make_backend(root, "none")) as (coordinator, _):
        observation = await coordinator.inspect("s1")
        assert [event.type for event in observation.events][: len(records) - 1] == [r["type"] for r in records[:-1]]
        assert observation.synthetic_tail == 2
        assert observation.torn_tail
        async with await coordinator.prepare("s1"):
            pass
    path = Path(writer.path_of("s1"))
    assert b"#garbage#" not in path.read_bytes()
    copies = sorted(path.parent.glob("session.jsonl.torn-*"))
    assert [copy.read_bytes() for copy in copies] == [tail]


async def test_raw_garbage_before_turn_end_is_corrupt(tmp_path: Path) -> None:
    """Raw garbage followed by a `turn/end` line is `SESSION_CORRUPT`, for inspect and prepare alike."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = closed_records(2)
    await writer.write("s1", stored_header("s1"), records[:3])
    await writer.append_bytes("s1", b"#garbage#\n" + encode_batch(records[3:]))
    async with running(make_backend(root, "none")) as (coordinator, _):
        before = tree_snapshot(root)
        for attempt in (coordinator.inspect, coordinator.prepare):
            with pytest.raises(SessionCorruptionError) as caught:
                await attempt("s1")
            assert caught.value.location == writer.path_of("s1")
        assert tree_snapshot(root) == before


def _big_open_step() -> list[dict[str, Any]]:
    """An open step whose chunk texts span several zstd blocks (128 KiB of content each)."""
    rng = random.Random(7)

    def build(session: Any) -> None:
        session.append("turn/start", {"turn": 0})
        session.append("step/start", {"turn": 0, "step": 1})
        for _ in range(8):
            text = rng.randbytes(20_000).hex()
            session.append("assistant/chunk", {"turn": 0, "step": 1, "chunk": {"type": "text-delta", "text": text}})

    return build_records(build)


@pytest.mark.parametrize("at", ["magic", "last-block", "checksum"])
async def test_torn_zstd_frame_is_recovered_and_rewritten_in_one_frame(tmp_path: Path, at: str) -> None:
    """A final frame torn in its magic, last block or checksum: complete records recovered, one new frame."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    head = closed_records(1)
    tail_records = [dict(record, seq=record["seq"] + len(head)) for record in _big_open_step()]
    await writer.write("s1", stored_header("s1"), head)
    await writer.append_frame("s1", encode_batch(tail_records) + b'{"type":"assistant/chunk","seq":99')
    torn_start = frame_spans(Path(writer.path_of("s1")).read_bytes())[-1][0]
    await writer.tear("s1", at)  # type: ignore[arg-type]
    path = writer.path_of("s1")
    prefix = Path(path).read_bytes()[:torn_start]
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        before = tree_snapshot(root)
        observation = await coordinator.inspect("s1")
        assert tree_snapshot(root) == before
        stored = len(observation.events) - observation.synthetic_tail
        recovered = stored - len(head)
        if at == "magic":
            assert recovered == 0
        elif at == "checksum":
            assert recovered == len(tail_records)
        else:
            assert 0 < recovered < len(tail_records)
        assert [event["seq"] for event in observation.events] == list(range(len(observation.events)))
        expected = [*head, *tail_records[:recovered]]
        assert [dict(event) for event in observation.events[:stored]] == expected
        async with await coordinator.prepare("s1"):
            pass
    data = Path(path).read_bytes()
    assert data[:torn_start] == prefix
    if at == "magic":
        # Nothing of the open turn survived: the log is balanced again, so only the cut is committed.
        assert data == prefix
    else:
        assert frame_spans(data)[-1] == (torn_start, len(data))  # exactly one new, complete frame
        text = zstandard.ZstdDecompressor().decompressobj().decompress(data[torn_start:])
        rewritten = [orjson.loads(line) for line in text.splitlines()]
        assert rewritten[:recovered] == tail_records[:recovered]
        assert [line["type"] for line in rewritten[recovered:]] == ["step/end", "turn/end"]
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        assert (await coordinator.inspect("s1")).synthetic_tail == 0


async def test_torn_tail_after_complete_turns_is_dropped_without_closers(tmp_path: Path) -> None:
    """A torn fragment after the last `turn/end` is removed by prepare; no closer is needed."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    records = closed_records(2)
    await writer.write("s1", stored_header("s1"), records)
    clean = Path(writer.path_of("s1")).read_bytes()
    await writer.append_bytes("s1", b"\x28\xb5")
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        observation = await coordinator.inspect("s1")
        assert observation.synthetic_tail == 0
        async with await coordinator.prepare("s1"):
            pass
    assert Path(writer.path_of("s1")).read_bytes() == clean


# ---------------------------------------------------------------- corruption inside complete frames


async def test_flipped_byte_in_complete_frame_is_corrupt(tmp_path: Path) -> None:
    """One flipped byte inside a complete frame is `SESSION_CORRUPT` (no later `turn/end` needed)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    records = open_step_records()
    await writer.write("s1", stored_header("s1"), records, batches=[6, len(records) - 6])
    await writer.flip_byte("s1", frame=2)
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        before = tree_snapshot(root)
        outcomes = await _read_paths(coordinator, "s1")
        assert isinstance(outcomes[0], SessionCorruptionError)
        assert isinstance(outcomes[1], SessionCorruptionError)
        assert outcomes[2] is None  # revision reads never decode events
        with pytest.raises(SessionCorruptionError):
            await coordinator.prepare("s1")
        assert tree_snapshot(root) == before


async def test_complete_frame_ending_mid_record_is_corrupt(tmp_path: Path) -> None:
    """A complete frame whose text ends mid-record is `SESSION_CORRUPT`."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    await writer.write("s1", stored_header("s1"), open_step_records())
    await writer.append_frame("s1", b'{"type":"assistant/chunk","seq":')
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match="torn JSONL record"):
            await coordinator.inspect("s1")


# ---------------------------------------------------------------- identity, refusals, round trips


async def test_header_id_mismatch_is_corrupt(tmp_path: Path, compression: str) -> None:
    """A header whose id differs from the requested id is `SESSION_CORRUPT`."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("other"), closed_records(1))
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match='requested id "s1"') as caught:
            await coordinator.inspect("s1")
        assert caught.value.location == writer.path_of("s1")


async def test_header_pointing_elsewhere_is_corrupt(tmp_path: Path, compression: str) -> None:
    """A header whose id + cwd name another path than where the file lies is `SESSION_CORRUPT`."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("s1", cwd="/a"), closed_records(1), cwd="/b")
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match="identify"):
            await coordinator.inspect("s1")
        listing = await coordinator.list()
        assert listing.rows == []
        assert [(d.location, d.code) for d in listing.damaged] == [(writer.path_of("s1"), "SESSION_CORRUPT")]


async def test_fixture_logs_in_the_documented_layout_load(tmp_path: Path, compression: str) -> None:
    """Logs built by the fixture writer (one event per line, upstream key order) load unchanged."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    records = closed_records(3)
    await writer.write("s1", stored_header("s1", cwd="/w", agentPreset="p"), records, batches=[5, 7, 6])
    async with running(make_backend(root, compression)) as (coordinator, _):
        observation = await coordinator.inspect("s1")
        assert [orjson.dumps(event) for event in observation.events] == [orjson.dumps(r) for r in records]
        assert observation.header.agent_preset == "p"


async def test_malformed_packed_row_is_corruption_of_its_line(tmp_path: Path, compression: str) -> None:
    """A packed `text-chunks` row that is not exactly the upstream shape is a corrupt line, named by its number."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    records: list[dict[str, Any]] = closed_records(1)
    malformed = {"type": "text-chunks", "seq0": len(records), "time": 1, "deltas": ["a", "b", "c"]}
    closer = {"type": "turn/end", "seq": len(records), "time": 1, "data": {"turn": 1, "reason": {"kind": "completed"}}}
    await writer.write("s1", stored_header("s1"), [*records, malformed, closer])
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(
            SessionCorruptionError, match=f"malformed text-chunks row at line {len(records) + 2}"
        ) as caught:
            await coordinator.inspect("s1")
        assert caught.value.location == writer.path_of("s1")


async def test_unknown_type_is_format_unsupported(tmp_path: Path, compression: str) -> None:
    """An unknown non-ignorable type is `SESSION_FORMAT_UNSUPPORTED` naming type and seq; ignorable loads."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    records = closed_records(1)
    foreign = {"type": "acme/x", "seq": len(records), "time": 1, "data": {}}
    await writer.write("s1", stored_header("s1"), [*records, foreign])
    await writer.write("s2", stored_header("s2"), [*records, dict(foreign, ignorable=True)])
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await coordinator.inspect("s1")
        assert (caught.value.event_type, caught.value.seq) == ("acme/x", len(records))
        observation = await coordinator.inspect("s2")
        assert observation.events[-1]["type"] == "acme/x"


@pytest.mark.parametrize(("version", "direction"), [(1, "newer"), (-1, "older")])
async def test_newer_or_older_version_names_the_file(
    tmp_path: Path, compression: str, version: int, direction: str
) -> None:
    """A foreign version is `SESSION_FORMAT_UNSUPPORTED` with direction, and the error names the file."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    header = dict(stored_header("s1"), version=version)
    await writer.write("s1", header, [{"type": "from/the-future", "payload": [1, 2]}])
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await coordinator.inspect("s1")
        error = caught.value
        assert (error.found_version, error.direction, error.session_id) == (version, direction, "s1")
        assert error.location == writer.path_of("s1")
        assert writer.path_of("s1") in str(error)
        listing = await coordinator.list()
        assert [(d.code, d.location) for d in listing.damaged] == [("SESSION_FORMAT_UNSUPPORTED", writer.path_of("s1"))]


async def test_empty_and_headerless_files_are_corrupt_on_read(tmp_path: Path, compression: str) -> None:
    """An empty file or one without a complete first record reads as `SESSION_CORRUPT`; the listing reports both."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write_bytes("empty", b"")
    await writer.write_bytes("half", writer.frame(b'{"type":"session","version":0,"id":"half"}\n')[:-3])
    async with running(make_backend(root, compression)) as (coordinator, _):
        for session_id in ("empty", "half"):
            with pytest.raises(SessionCorruptionError, match="empty or header-less"):
                await coordinator.inspect(session_id)
        listing = await coordinator.list()
        assert listing.rows == []
        assert sorted((d.session_id, d.code) for d in listing.damaged) == [
            ("empty", "SESSION_CORRUPT"),
            ("half", "SESSION_CORRUPT"),
        ]


async def test_oversized_integer_is_format_unsupported(tmp_path: Path, compression: str) -> None:
    """An integer outside signed 64 bits in a record is `SESSION_FORMAT_UNSUPPORTED` (never a silent float)."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    records: list[dict[str, Any]] = closed_records(1)
    huge = {"type": "session/title", "seq": len(records), "time": 1, "data": {"title": "t", "n": 2**70}}
    await writer.write("s1", stored_header("s1"), [*records, huge])
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await coordinator.inspect("s1")
        assert caught.value.seq == len(records)


async def test_missing_session_is_not_found(tmp_path: Path, compression: str) -> None:
    """An id with no artifact is `SESSION_NOT_FOUND` for inspect and prepare."""
    async with running(make_backend(tmp_path / "sessions", compression)) as (coordinator, _):
        for attempt in (coordinator.inspect, coordinator.prepare, coordinator.read_events):
            with pytest.raises(SessionNotFoundError):
                await attempt("nobody")


async def test_read_paths_never_modify_damaged_logs(tmp_path: Path, compression: str) -> None:
    """inspect, read_events, revision and list leave every damaged artifact byte-identical."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    records = open_step_records()
    await writer.write("torn", stored_header("torn"), records)
    await writer.append_bytes("torn", b'{"partial":')
    await writer.write("corrupt", stored_header("corrupt"), closed_records(1))
    await writer.damage_events("corrupt")
    await writer.write("mismatch", stored_header("elsewhere"), records)
    await writer.write("future", dict(stored_header("future"), version=3), records)
    await writer.write("open", stored_header("open"), records)
    async with running(make_backend(root, compression)) as (coordinator, _):
        before = tree_snapshot(root)
        for session_id in ("torn", "corrupt", "mismatch", "future", "open"):
            await _read_paths(coordinator, session_id)
        assert tree_snapshot(root) == before


async def test_damage_events_fixture_is_corruption(tmp_path: Path, compression: str) -> None:
    """The fixture writer's `damage_events` yields `SESSION_CORRUPT` while the header stays listable."""
    root = tmp_path / "sessions"
    writer: JsonlLogWriter = make_writer(root, compression)
    await writer.write("s1", stored_header("s1"), closed_records(1))
    await writer.damage_events("s1")
    async with running(make_backend(root, compression)) as (coordinator, _):
        assert [row.header.id for row in await coordinator.list()] == ["s1"]
        with pytest.raises(SessionCorruptionError):
            await coordinator.inspect("s1")
