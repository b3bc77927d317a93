"""Packed chunk rows, as the TypeScript harness writes them by default, read as the events they stand for.

Hand-written rows pin the expansion literally (seq, time, chunk); generated upstream-default logs
(`dsh.testing.upstream_logs`) must load, list and fold exactly like their one-event-per-line form;
a property test packs random chunk streams the way the harness does; malformed rows are corruption
of their line; crash repair and cold resume see the expanded events
(docs/storage-format.md#compatibility-with-the-typescript-harness).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.persistence.errors import SessionCorruptionError
from dsh.persistence.jsonl._format import LogContext, split_head
from dsh.persistence.jsonl._scan import scan_events
from dsh.session.surface import Surface
from dsh.session.validate import check_records
from dsh.testing.jsonl_writer import TearPoint, frame_spans
from dsh.testing.stored_logs import stored_header
from dsh.testing.upstream_logs import UpstreamLogBuilder, pack_chunk_runs
from tests.helpers import examples
from tests.persistence.helpers import make_backend, make_writer, plain, running, upstream_session

T0 = 1_789_000_000_000


def _head(turn: int = 1) -> list[dict[str, Any]]:
    """turn/start, a user message and step/start (seqs 0-2)."""
    user = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    return [
        {"type": "turn/start", "seq": 0, "time": T0, "data": {"turn": turn}},
        {"type": "user/message", "seq": 1, "time": T0 + 1, "data": user, "surfaceOp": "append"},
        {"type": "step/start", "seq": 2, "time": T0 + 2, "data": {"turn": turn, "step": 1}},
    ]


def _tail(seq: int, turn: int = 1) -> list[dict[str, Any]]:
    """step/end and turn/end at `seq`, `seq + 1`."""
    return [
        {"type": "step/end", "seq": seq, "time": T0 + 90, "data": {"turn": turn, "step": 1}},
        {"type": "turn/end", "seq": seq + 1, "time": T0 + 91, "data": {"turn": turn, "reason": {"kind": "completed"}}},
    ]


def _chunk(seq: int, time: int, chunk: dict[str, Any]) -> dict[str, Any]:
    return {"type": "assistant/chunk", "seq": seq, "time": time, "data": {"turn": 1, "step": 1, "chunk": chunk}}


# ---------------------------------------------------------------- hand-written rows, literal events


async def test_a_run_of_exactly_three_expands_to_three_literal_events(tmp_path: Path, compression: str) -> None:
    """`text-chunks` with three texts and `dt [4, 9]` is seqs 3-5 at times t, t+4, t+13 with literal text deltas."""
    root = tmp_path / "sessions"
    row = {
        "type": "text-chunks",
        "seq0": 3,
        "time0": T0 + 10,
        "data": {"turn": 1, "step": 1, "index": 0, "dt": [4, 9], "texts": ["Hel", "lo", " world"]},
    }
    await make_writer(root, compression).write("s1", stored_header("s1"), [*_head(), row, *_tail(6)])
    async with running(make_backend(root, compression)) as (coordinator, _):
        events = plain((await coordinator.inspect("s1")).events)
    assert events[3:6] == [
        _chunk(3, T0 + 10, {"type": "text-delta", "index": 0, "text": "Hel"}),
        _chunk(4, T0 + 14, {"type": "text-delta", "index": 0, "text": "lo"}),
        _chunk(5, T0 + 23, {"type": "text-delta", "index": 0, "text": " world"}),
    ]
    assert [event["seq"] for event in events] == list(range(8))


async def test_a_negative_gap_moves_a_member_back_in_time(tmp_path: Path, compression: str) -> None:
    """`reasoning-chunks` with `dt [-3, 5, -1]` gives times t, t-3, t+2, t+1 (the writer's clock stepped back)."""
    root = tmp_path / "sessions"
    row = {
        "type": "reasoning-chunks",
        "seq0": 3,
        "time0": T0 + 50,
        "data": {"turn": 1, "step": 1, "index": 2, "dt": [-3, 5, -1], "texts": ["a", "", "b", "c"]},
    }
    await make_writer(root, compression).write("s1", stored_header("s1"), [*_head(), row, *_tail(7)])
    async with running(make_backend(root, compression)) as (coordinator, _):
        events = plain((await coordinator.inspect("s1")).events)
    assert events[3:7] == [
        _chunk(3, T0 + 50, {"type": "reasoning-delta", "index": 2, "text": "a"}),
        _chunk(4, T0 + 47, {"type": "reasoning-delta", "index": 2, "text": ""}),
        _chunk(5, T0 + 52, {"type": "reasoning-delta", "index": 2, "text": "b"}),
        _chunk(6, T0 + 51, {"type": "reasoning-delta", "index": 2, "text": "c"}),
    ]


async def test_tool_call_rows_with_and_without_a_name(tmp_path: Path, compression: str) -> None:
    """A `tool-call-chunks` row without `name` gives deltas without `name`; with one, every delta carries it."""
    root = tmp_path / "sessions"
    unnamed = {
        "type": "tool-call-chunks",
        "seq0": 3,
        "time0": T0 + 20,
        "data": {"turn": 1, "step": 1, "index": 1, "id": "call-7", "dt": [0, 2], "args": ['{"a"', ":", "1}"]},
    }
    named = {
        "type": "tool-call-chunks",
        "seq0": 6,
        "time0": T0 + 30,
        "data": {"turn": 1, "step": 1, "index": 2, "id": "call-8", "name": "ls", "dt": [1, 1], "args": ["{", "", "}"]},
    }
    await make_writer(root, compression).write("s1", stored_header("s1"), [*_head(), unnamed, named, *_tail(9)])
    async with running(make_backend(root, compression)) as (coordinator, _):
        events = plain((await coordinator.inspect("s1")).events)

    def call(seq: int, time: int, index: int, call_id: str, delta: str, name: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": call_id}
        if name is not None:
            chunk["name"] = name
        chunk["argumentsDelta"] = delta
        return _chunk(seq, time, chunk)

    assert events[3:9] == [
        call(3, T0 + 20, 1, "call-7", '{"a"'),
        call(4, T0 + 20, 1, "call-7", ":"),
        call(5, T0 + 22, 1, "call-7", "1}"),
        call(6, T0 + 30, 2, "call-8", "{", "ls"),
        call(7, T0 + 31, 2, "call-8", "", "ls"),
        call(8, T0 + 32, 2, "call-8", "}", "ls"),
    ]
    assert "name" not in events[3]["data"]["chunk"]


# ---------------------------------------------------------------- generated upstream-default logs


@pytest.mark.parametrize("open_turn", [False, True])
async def test_upstream_default_logs_read_like_their_unpacked_form(
    tmp_path: Path, compression: str, open_turn: bool
) -> None:
    """Packed text, reasoning and tool-call runs, runs split by flushes and negative gaps load as the unpacked log."""
    log = upstream_session(open_turn=open_turn)
    packed_root, plain_root = tmp_path / "packed", tmp_path / "plain"
    header = stored_header(log.session_id, cwd="/w")
    packed_writer = make_writer(packed_root, compression)
    await packed_writer.write(log.session_id, header, log.stored, batches=log.batches, pack_chunks=True)
    await make_writer(plain_root, compression).write(log.session_id, header, log.stored, batches=log.batches)
    if compression == "none":
        lines = Path(packed_writer.path_of(log.session_id)).read_bytes().count(b"\n") - 1
        assert lines < len(log.expected) - 20  # the fixture really is packed
    async with (
        running(make_backend(packed_root, compression)) as (packed, _),
        running(make_backend(plain_root, compression)) as (unpacked, _),
    ):
        a = await packed.inspect(log.session_id)
        b = await unpacked.inspect(log.session_id)
        assert plain(a.events)[: len(log.expected)] == log.expected
        assert plain(a.events) == plain(b.events)
        assert a.synthetic_tail == b.synthetic_tail == (2 if open_turn else 0)
        assert a.header == b.header
        typed = await packed.read_events(log.session_id, types={"assistant/chunk"}, from_seq=30)
        expected_chunks = [e for e in log.expected if e["type"] == "assistant/chunk" and e["seq"] >= 30]
        assert plain(typed.events) == expected_chunks
        rows_a = [row.header for row in (await packed.list()).rows]
        rows_b = [row.header for row in (await unpacked.list()).rows]
        assert rows_a == rows_b != []


def test_the_packer_never_packs_shorter_runs_or_across_batches() -> None:
    """Runs of two stay events, a flush splits a run, and non-delta chunks stay one per line."""
    b = UpstreamLogBuilder("s")
    b.deltas(1, 1, ["a", "b"])
    b.chunk(1, 1, {"type": "text-end", "index": 0})
    b.deltas(1, 1, ["c", "d", "e"], index=1)
    b.flush()
    b.deltas(1, 1, ["f", "g"], index=1)
    log = b.build()
    first = pack_chunk_runs(log.stored[:6])
    second = pack_chunk_runs(log.stored[6:])
    assert [record["type"] for record in first] == ["assistant/chunk"] * 3 + ["text-chunks"]
    assert [record["type"] for record in second] == ["assistant/chunk"] * 2


# ---------------------------------------------------------------- property: random streams, packed per batch

_PIECE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=4)


@st.composite
def _streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int]]:
    """A random step of chunk events (deltas of every kind, boundaries, clock steps back) and its flushes."""
    b = UpstreamLogBuilder("p", time=draw(st.integers(-(2**40), 2**40)))
    b.turn_start(1)
    b.step_start(1, 1)
    for _ in range(draw(st.integers(0, 12))):
        choice = draw(st.sampled_from(["text", "reasoning", "call", "boundary", "flush"]))
        index = draw(st.integers(0, 2))
        if choice == "flush":
            b.flush()
        elif choice == "boundary":
            b.chunk(1, 1, {"type": "text-end", "index": index})
        elif choice == "call":
            pieces = draw(st.lists(_PIECE, min_size=1, max_size=6))
            name = draw(st.sampled_from([None, "ls"]))
            name_on = draw(st.sampled_from(["all", "first"]))
            b.call_deltas(1, 1, draw(st.sampled_from(["c1", "c2"])), pieces, name=name, name_on=name_on, index=index)
        else:
            pieces = draw(st.lists(_PIECE, min_size=1, max_size=6))
            gaps = draw(st.lists(st.integers(-50, 50), min_size=len(pieces), max_size=len(pieces)))
            times = []
            for gap in gaps:
                b.time += gap
                times.append(b.time)
            b.deltas(1, 1, pieces, kind=choice, index=index, times=times)  # type: ignore[arg-type]
    b.step_end(1, 1)
    b.turn_end(1)
    log = b.build()
    return log.stored, log.batches


@settings(max_examples=examples(300), deadline=None)
@given(stream=_streams(), compression=st.sampled_from(["zstd", "none"]))
def test_random_streams_packed_per_batch_read_as_the_unpacked_log(
    stream: tuple[list[dict[str, Any]], list[int]], compression: str
) -> None:
    """Packing random delta streams per flush batch, as the harness does, never changes what a reader sees."""
    records, batches = stream
    with tempfile.TemporaryDirectory() as directory:
        writer = make_writer(directory, compression)
        header = stored_header("p")
        packed = writer.encode(header, records, batches=batches, pack_chunks=True)
        unpacked = writer.encode(header, records, batches=batches)
    ctx = LogContext("p", None)
    scans = []
    for data in (packed, unpacked):
        head = split_head(data, compression, ctx)  # type: ignore[arg-type]
        assert head is not None
        scans.append(scan_events(data, head.end, compression, ctx))  # type: ignore[arg-type]
    assert list(scans[0].records) == list(scans[1].records) == records
    assert scans[0].torn is None
    assert check_records(scans[0].records, Surface()) is None


_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
)
_VALUE = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=4))
_DATA_KEYS = ["turn", "step", "index", "dt", "texts", "args", "id", "name", "extra"]


@st.composite
def _rows(draw: st.DrawFn) -> dict[str, Any]:
    """Row-tagged objects with any subset of the row's keys and values of any JSON type."""
    data = {key: draw(_VALUE) for key in draw(st.lists(st.sampled_from(_DATA_KEYS), unique=True))}
    row: dict[str, Any] = {"type": draw(st.sampled_from(["text-chunks", "reasoning-chunks", "tool-call-chunks"]))}
    for key in draw(st.lists(st.sampled_from(["seq0", "time0", "data", "seq"]), unique=True)):
        row[key] = data if key == "data" and draw(st.booleans()) else draw(_VALUE)
    return row


@settings(max_examples=examples(500), deadline=None)
@given(row=_rows())
def test_any_row_tagged_line_is_read_or_refused_never_a_crash(row: dict[str, Any]) -> None:
    """Whatever a row-tagged line holds, the scanner accepts it exactly or records a defect of its line."""
    head = b'{"type":"session","version":0,"id":"p","createdAt":1,"delegationDepth":0}\n'
    data = head + orjson.dumps(row) + b"\n"
    scan = scan_events(data, len(head), "none", LogContext("p", None))
    if scan.torn is None:
        events = list(scan.records)
        assert [event["seq"] for event in events] == list(range(len(events)))
        check_records(scan.records, Surface())
    else:
        assert list(scan.records) == []


# ---------------------------------------------------------------- malformed rows


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "type": "text-chunks",
        "seq0": 3,
        "time0": T0,
        "data": {"turn": 1, "step": 1, "index": 0, "dt": [1, 1], "texts": ["a", "b", "c"]},
    }
    data = changes.pop("data", {})
    row.update(changes)
    row["data"] = {**row["data"], **data}
    return row


_MALFORMED = {
    "wrong dt length": _row(data={"dt": [1]}),
    "non-string member": _row(data={"texts": ["a", 7, "c"]}),
    "unsafe integer time": _row(time0=2**53),
    "member time leaves the safe range": _row(time0=2**53 - 2, data={"dt": [1, 1]}),
    "extra envelope key": {**_row(), "seq": 3},
    "extra data key": _row(data={"note": "x"}),
    "missing id": {
        **_row(type="tool-call-chunks"),
        "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "args": ["{}"]},
    },
    "name not a string": {
        **_row(type="tool-call-chunks"),
        "data": {"turn": 1, "step": 1, "index": 0, "id": "c", "name": 5, "dt": [], "args": ["{}"]},
    },
    "empty texts": _row(data={"texts": [], "dt": []}),
    "float gap": _row(data={"dt": [1, 0.5]}),
    "negative seq0": _row(seq0=-1),
    "turn not a number": _row(data={"turn": "1"}),
    "seq gap after expansion": _row(seq0=4),
}


@pytest.mark.parametrize("name", sorted(_MALFORMED))
async def test_malformed_rows_are_corruption_with_their_line_number(
    tmp_path: Path, compression: str, name: str
) -> None:
    """A malformed row followed by a `turn/end` is `SESSION_CORRUPT` naming the row's line; nothing crashes."""
    root = tmp_path / "sessions"
    records = [*_head(), _MALFORMED[name], *_tail(6)]
    await make_writer(root, compression).write("s1", stored_header("s1"), records)
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match="at line 5") as caught:
            await coordinator.inspect("s1")
    assert caught.value.code == "SESSION_CORRUPT"
    assert ("seq gap" in caught.value.message) == (name == "seq gap after expansion")


async def test_a_well_formed_row_whose_events_break_an_event_rule_is_corruption(
    tmp_path: Path, compression: str
) -> None:
    """A row the expander accepts (`turn` 1.5 is a number) still yields events the chunk rule refuses: corrupt."""
    root = tmp_path / "sessions"
    records = [*_head(), _row(data={"turn": 1.5}), *_tail(6)]
    await make_writer(root, compression).write("s1", stored_header("s1"), records)
    async with running(make_backend(root, compression)) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match=r'"assistant/chunk" has invalid data') as caught:
            await coordinator.inspect("s1")
    assert caught.value.code == "SESSION_CORRUPT"


async def test_a_malformed_row_at_the_end_of_a_raw_log_is_a_torn_tail(tmp_path: Path) -> None:
    """With no `turn/end` after it, a malformed row is a torn tail that `prepare` cuts away like any other."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    await writer.write("s1", stored_header("s1"), [*_head(), _MALFORMED["wrong dt length"]])
    size = len(Path(writer.path_of("s1")).read_bytes())
    async with running(make_backend(root, "none")) as (coordinator, _):
        observation = await coordinator.inspect("s1")
        assert [event.type for event in observation.events] == [
            "turn/start",
            "user/message",
            "step/start",
            "step/end",
            "turn/end",
        ]
        async with await coordinator.prepare("s1"):
            pass
    data = Path(writer.path_of("s1")).read_bytes()
    assert b"text-chunks" not in data
    assert len(data) != size


# ---------------------------------------------------------------- crash repair and cold resume


async def test_a_packed_row_in_a_torn_zstd_frame_is_recovered_as_events(tmp_path: Path) -> None:
    """Complete packed rows inside a torn final frame are recovered, and the repair rewrites them one event per line."""
    root = tmp_path / "sessions"
    log = upstream_session(open_turn=True, turns=1)
    writer = make_writer(root, "zstd")
    await writer.write(log.session_id, stored_header(log.session_id), log.stored, batches=log.batches, pack_chunks=True)
    path = Path(writer.path_of(log.session_id))
    data = path.read_bytes()
    start, end = frame_spans(data)[-1]
    last = zstandard.ZstdDecompressor().decompress(data[start:end])
    assert b"text-chunks" in last  # the open step's run sits in the final frame
    # Replace the final frame by a torn one whose plaintext keeps the packed row and ends in a fragment.
    torn = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(last + b'{"type":"step/e')
    path.write_bytes(data[:start] + torn[:-3])
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        observation = await coordinator.inspect(log.session_id)
        assert plain(observation.events[: len(log.expected)]) == log.expected
        assert observation.synthetic_tail == 2  # step/end and turn/end
        async with await coordinator.prepare(log.session_id):
            pass
    repaired = zstandard.ZstdDecompressor().stream_reader(path.read_bytes(), read_across_frames=True).read()
    tail = repaired.split(b"\n")[-(2 + 1 + 4) :]
    assert all(b"seq0" not in line for line in tail)
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        again = await coordinator.inspect(log.session_id)
        assert plain(again.events) == plain(observation.events)
        assert again.synthetic_tail == 0


async def test_a_packed_row_before_the_last_turn_end_and_a_torn_raw_tail(tmp_path: Path) -> None:
    """Valid packed rows before the last `turn/end` stay committed; a fragment after them is the only torn part."""
    root = tmp_path / "sessions"
    log = upstream_session(turns=2)
    writer = make_writer(root, "none")
    await writer.write(log.session_id, stored_header(log.session_id), log.stored, batches=log.batches, pack_chunks=True)
    await writer.append_bytes(log.session_id, b'{"type":"turn/sta')
    async with running(make_backend(root, "none")) as (coordinator, _):
        observation = await coordinator.inspect(log.session_id)
        assert plain(observation.events) == log.expected
        async with await coordinator.prepare(log.session_id):
            pass
    assert not Path(writer.path_of(log.session_id)).read_bytes().endswith(b"turn/sta")


@pytest.mark.parametrize(("tear", "recovered"), [("magic", 0), ("last-block", 0), ("checksum", 3)])
async def test_a_run_split_across_flushes_survives_a_torn_second_batch(
    tmp_path: Path, tear: TearPoint, recovered: int
) -> None:
    """A run packed on both sides of a flush: tearing the second frame keeps the first row (and any complete row)."""
    root = tmp_path / "sessions"
    b = UpstreamLogBuilder("s1")
    b.turn_start(1)
    b.step_start(1, 1)
    b.deltas(1, 1, ["a", "b", "c", "d"])
    b.flush()
    b.deltas(1, 1, ["e", "f", "g"])
    log = b.build()
    writer = make_writer(root, "zstd")
    await writer.write("s1", stored_header("s1"), log.stored, batches=log.batches, pack_chunks=True)
    await writer.tear("s1", tear)
    kept = 6 + recovered
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        observation = await coordinator.inspect("s1")
        assert plain(observation.events[:kept]) == log.expected[:kept]
        assert [event.type for event in observation.events[kept:]] == ["step/end", "turn/end"]
        async with await coordinator.prepare("s1"):
            pass
        repaired = await coordinator.inspect("s1")
        assert plain(repaired.events) == plain(observation.events)
        assert repaired.synthetic_tail == 0


async def test_events_appended_after_resuming_a_packed_log_are_one_per_line(tmp_path: Path, compression: str) -> None:
    """A resumed upstream log keeps its packed rows; new events follow one per line and the whole log reads back."""
    root = tmp_path / "sessions"
    log = upstream_session(turns=1)
    writer = make_writer(root, compression)
    await writer.write(log.session_id, stored_header(log.session_id), log.stored, batches=log.batches, pack_chunks=True)
    async with running(make_backend(root, compression)) as (coordinator, store):
        prepared = await coordinator.prepare(log.session_id)
        session = prepared.publish()
        session.append("turn/start", {"turn": 2})
        chunk = {"type": "text-delta", "index": 0, "text": "x"}
        for _ in range(3):
            session.append("assistant/chunk", {"turn": 2, "step": 1, "chunk": chunk})
        session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
        appended = plain(session.events[len(log.expected) :])
        await store.flush(session)
    async with running(make_backend(root, compression)) as (coordinator, _):
        events = plain((await coordinator.inspect(log.session_id)).events)
    assert events == log.expected + appended
    raw = Path(writer.path_of(log.session_id)).read_bytes()
    if compression == "zstd":
        raw = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
    new_lines = raw.rstrip(b"\n").split(b"\n")[-len(appended) :]
    assert [orjson.loads(line) for line in new_lines] == appended
