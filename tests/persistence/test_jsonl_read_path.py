"""The JSONL read path: each line parsed once to validate, events deeply immutable, `-0.0` read as `0.0`,
chunks parsed in one call, and the collector kept off what the read builds."""

from __future__ import annotations

import gc
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.persistence.jsonl._format as jsonl_format
import dsh.session.stored as stored_module
from dsh._accel import speedups
from dsh._lazy_json import LazyFrozenDict, LazyFrozenList
from dsh.json import FrozenDict, FrozenList
from dsh.persistence._validation import validate_log
from dsh.session.events import SessionEvent
from dsh.session.stored import LineRecords, StoredEvents, collector_paused
from dsh.testing.stored_logs import stored_header
from tests.helpers import examples
from tests.persistence.helpers import every_type_records, make_backend, make_writer, running


def _assert_frozen_all_the_way(value: Any) -> None:
    """Walk `value` through its public API only; every container reached must be a frozen type."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            assert isinstance(node, FrozenDict), type(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            assert isinstance(node, FrozenList), type(node)
            stack.extend(node)


def _notes(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "type": "session/title",
            "seq": start + i,
            "time": 1_000 + i,
            "data": {"title": f"t{i}", "tags": [i, {"k": i}]},
        }
        for i in range(count)
    ]


async def test_cold_events_are_deeply_immutable_and_equal_the_stored_records(tmp_path: Path, compression: str) -> None:
    """Every event of a cold JSONL read is frozen all the way down, refuses mutation and equals what was stored."""
    records = every_type_records()
    await make_writer(tmp_path, compression).write("s1", stored_header("s1"), records)
    async with running(make_backend(tmp_path, compression)) as (coordinator, _store):
        observation = await coordinator.inspect("s1")
    events = list(observation.events)
    assert events == records
    for event in events:
        assert type(event) is SessionEvent
        _assert_frozen_all_the_way(event)
        with pytest.raises(TypeError):
            event["seq"] = 9  # type: ignore[index]
        data: Any = event.data
        if isinstance(data, dict) and data:
            with pytest.raises(TypeError):
                data[next(iter(data))] = 1
    message: Any = next(event for event in events if event.type == "assistant/message").data
    with pytest.raises(TypeError):
        message["message"]["content"].append({"type": "text", "text": "x"})
    assert orjson.dumps(events) == orjson.dumps(records)


async def test_negative_zero_in_a_stored_line_reads_as_zero(tmp_path: Path, compression: str) -> None:
    """A `-0.0` written by a foreign writer reads as `0.0` (also when encoded again); its neighbours stay lazy."""
    records = _notes(3)
    records[1]["data"]["score"] = -0.0
    await make_writer(tmp_path, compression).write("s1", stored_header("s1"), records)
    async with running(make_backend(tmp_path, compression)) as (coordinator, _store):
        single = (await coordinator.read_events("s1")).events
        whole = await coordinator.inspect("s1")
    # One event touched on its own, then every event of a chunk touched at once.
    for picked in (single[1], list(whole.events)[1]):
        data: Any = picked.data
        assert math.copysign(1.0, data["score"]) == 1.0
        assert b"-0.0" not in orjson.dumps(picked)
        _assert_frozen_all_the_way(picked)
    assert type(whole.events[0].data) is LazyFrozenDict


def test_a_negative_exponent_that_underflows_is_read_as_zero_too() -> None:
    """A line spelling `-1e-400` (which parses to -0.0) is frozen by the exact rules, not wrapped."""
    line = b'{"type":"session/title","seq":0,"time":1,"data":{"x":-1e-400,"y":-5,"d":"2024-01-05"}}'
    plain = b'{"type":"session/title","seq":1,"time":1,"data":{"y":-5,"d":"2024-01-05","z":-0.5}}'
    events = StoredEvents(LineRecords([line, plain], ["session/title"] * 2))
    first: Any = events[0]
    assert math.copysign(1.0, first.data["x"]) == 1.0
    assert type(first.data) is FrozenDict
    assert type(events[1].data) is LazyFrozenDict
    assert stored_module.may_hold_negative_zero(line)
    assert not stored_module.may_hold_negative_zero(plain)


async def test_a_full_read_parses_each_line_once_and_touching_parses_nothing_more_with_c_helpers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scanning parses every line once; touching every event parses nothing more with the C helpers,
    else one chunk of lines per 512 events."""
    records = _notes(1_200)
    await make_writer(tmp_path, "zstd").write("s1", stored_header("s1"), records)
    calls: list[int] = []
    real_loads = orjson.loads

    def counting(data: Any) -> Any:
        calls.append(1)
        return real_loads(data)

    async with running(make_backend(tmp_path, "zstd")) as (coordinator, _store):
        monkeypatch.setattr(orjson, "loads", counting)
        observation = await coordinator.inspect("s1")
        scanned = len(calls)
        touched = [event.data for event in observation.events]
        monkeypatch.setattr(orjson, "loads", real_loads)
    assert len(touched) == 1_200
    # Every event line, the header line and, with the helpers, the small object that hands the C
    # check the parser's key objects.
    assert scanned <= 1_200 + 1 + (speedups is not None)
    # With the helpers the scan's parses are the events; else chunks of 512, 512 and 176 lines.
    assert len(calls) - scanned == (0 if speedups is not None else 3)


async def test_a_chunk_too_deep_for_one_array_is_parsed_line_by_line(tmp_path: Path) -> None:
    """A line at the parser's depth limit cannot be parsed inside the chunk's array; it is read on its own."""
    writer = make_writer(tmp_path, "zstd")
    await writer.write("s1", stored_header("s1"), _notes(2))
    deep = b"[" * 1023 + b"]" * 1023
    line = b'{"type":"session/title","seq":2,"time":5,"data":' + deep + b"}\n"
    await writer.append_frame("s1", line)
    async with running(make_backend(tmp_path, "zstd")) as (coordinator, _store):
        observation = await coordinator.inspect("s1")
    events = list(observation.events)
    assert len(events) == 3
    value: Any = events[2].data
    depth = 0
    while value:
        assert isinstance(value, FrozenList)
        value = value[0]
        depth += 1
    assert depth == 1022


async def _touch_counting_per_event_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: list[dict[str, Any]]
) -> tuple[list[SessionEvent], list[int]]:
    """Store `records`, read them cold, touch every event; returns the events and the seqs frozen one by one."""
    await make_writer(tmp_path, "zstd").write("s1", stored_header("s1"), records)
    calls: list[int] = []
    real_view_event = stored_module.view_event

    def counting(record: dict[str, Any]) -> SessionEvent:
        calls.append(record["seq"])
        return real_view_event(record)

    async with running(make_backend(tmp_path, "zstd")) as (coordinator, _store):
        observation = await coordinator.inspect("s1")
        monkeypatch.setattr(stored_module, "view_event", counting)
        events = list(observation.events)
    return events, calls


async def test_a_chunk_of_certain_records_is_frozen_with_no_call_per_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Touching a log of plain events freezes no event through `view_event`, whatever each payload holds."""
    records = _notes(600)
    for index, payload in ((3, [1, {"k": [2]}]), (4, "text"), (5, 7), (6, None)):
        records[index]["data"] = payload
    events, calls = await _touch_counting_per_event_views(tmp_path, monkeypatch, records)
    assert calls == []
    assert events == records
    assert [type(event.data) for event in events[2:7]] == [LazyFrozenDict, LazyFrozenList, str, int, type(None)]
    for event in events:
        assert type(event) is SessionEvent
        _assert_frozen_all_the_way(event)


async def test_a_chunk_holding_an_uncertain_record_is_frozen_event_by_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the chunk holding a record the scan was unsure of goes event by event (with the C helpers,
    only that record); every event stays equal."""
    records = _notes(600)
    records[10] = {"type": "x/custom", "seq": 10, "time": 5, "data": {"n": [1]}, "ignorable": True}
    events, calls = await _touch_counting_per_event_views(tmp_path, monkeypatch, records)
    # Without the helpers the first chunk's lines go one by one; with them the scan's events are taken.
    assert calls == ([10] if speedups is not None else list(range(512)))
    assert events == records
    assert type(events[10].data) is FrozenDict  # an uncommon envelope is frozen whole
    for event in events:
        _assert_frozen_all_the_way(event)


def test_validation_takes_the_lines_over(tmp_path: Path) -> None:
    """After validation the backend's result no longer holds the lines (a lingering reference keeps nothing)."""
    from dsh.persistence.base import Revision, StoredLog

    lines = [orjson.dumps(record) for record in _notes(3)]
    scanned = LineRecords(lines, ["session/title"] * 3, bytearray([1, 1, 1]))
    log = StoredLog(header=stored_header("s1"), events=scanned, revision=Revision("r1"))
    validated = validate_log("s1", log, None)
    assert len(scanned) == 0
    assert list(validated.events) == _notes(3)


def test_a_pause_that_keeps_its_objects_moves_them_to_the_oldest_generation() -> None:
    """`collector_paused(keep=True)` leaves what it built in the oldest generation and the young count at zero."""
    if gc.get_freeze_count():
        # Python 3.12.1 starts with objects in the permanent generation; the pause then leaves it alone.
        pytest.skip("this interpreter keeps frozen objects, so the pause does not move anything")
    assert gc.isenabled()
    with collector_paused(keep=True):
        kept = [{"n": [i]} for i in range(2_000)]
    assert gc.isenabled()
    assert gc.get_count()[0] < 100
    oldest = {id(item) for item in gc.get_objects(generation=2)}
    assert id(kept[0]) in oldest
    assert id(kept[-1]) in oldest


def test_a_pause_leaves_a_process_that_froze_objects_alone() -> None:
    """When the process keeps frozen objects, the pause does not unfreeze them (no move happens)."""
    gc.freeze()
    try:
        with collector_paused(keep=True):
            kept = [{"n": [i]} for i in range(100)]
        assert gc.get_freeze_count() > 0
        assert id(kept[0]) not in {id(item) for item in gc.get_objects(generation=2)}
    finally:
        gc.unfreeze()


def test_nested_pauses_keep_the_collector_state() -> None:
    """An inner pause never re-enables a collector the caller disabled."""
    gc.disable()
    try:
        with collector_paused(keep=True):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_a_full_iteration_triggers_no_full_collection(tmp_path: Path) -> None:
    """Touching every event of a 3,000-event log runs no oldest-generation collection."""
    await make_writer(tmp_path, "zstd").write("s1", stored_header("s1"), _notes(3_000))
    full: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    async with running(make_backend(tmp_path, "zstd")) as (coordinator, _store):
        observation = await coordinator.inspect("s1")
        gc.collect()
        gc.callbacks.append(watch)
        try:
            for event in observation.events:
                _ = event.data
        finally:
            gc.callbacks.remove(watch)
    assert full == []


def test_the_scanner_keeps_each_record_as_its_line_or_with_the_c_helpers_as_its_event() -> None:
    """The scan result holds each record's type and fast verdict, and the record as its validated line
    or, with the C helpers, as the event its one parse became."""
    records = _notes(4)
    text = b"".join(orjson.dumps(record) + b"\n" for record in records)
    scan = jsonl_format.scan_events(text, 0, "none", jsonl_format.LogContext("s1", None))
    assert isinstance(scan.events, LineRecords)
    assert scan.events.types == ["session/title"] * 4
    assert scan.events.verdicts == bytearray([1, 1, 1, 1])
    if speedups is None:
        assert scan.events.lines == [orjson.dumps(record) for record in records]
        assert scan.events.parsed is None
    else:
        assert scan.events.lines == [None] * 4
        assert scan.events.parsed == records
        assert all(type(event) is SessionEvent for event in scan.events.parsed)
    # Either way, indexing and slicing hand out plain records.
    assert scan.events[1] == records[1]
    assert type(scan.events[1]) is dict
    assert scan.events[1:3] == records[1:3]
    assert [type(record) for record in scan.events[0:4]] == [dict] * 4


_NUMBERS = st.builds(
    lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
    st.sampled_from(["", "-"]),
    st.sampled_from(["0"]) | st.integers(1, 10**6).map(str),
    st.sampled_from([""])
    | st.text("0123456789", min_size=1, max_size=6).map(lambda d: "." + d)
    | st.integers(0, 400).map(lambda zeros: "." + "0" * zeros + "1"),
    st.sampled_from([""])
    | st.builds(
        lambda e, s, n: f"{e}{s}{n}", st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 500)
    ),
)


@settings(max_examples=examples(500), deadline=None)
@given(_NUMBERS, st.sampled_from(['{"x":%s}', "[1,%s]", '{"a":[%s],"d":"2024-01-05"}']))
def test_property_every_spelling_of_negative_zero_is_noticed(number: str, template: str) -> None:
    """Any JSON number that parses to -0.0 makes `may_hold_negative_zero` say yes for its line."""
    text = (template % number).encode()
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return
    values = list(parsed.values()) if isinstance(parsed, dict) else parsed
    values = [v for item in values for v in (item if isinstance(item, list) else [item])]
    if any(type(v) is float and v == 0.0 and math.copysign(1.0, v) < 0 for v in values):
        assert stored_module.may_hold_negative_zero(text)
