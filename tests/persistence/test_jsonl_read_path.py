"""The JSONL read path: each line parsed once, the parse kept and handed out as deeply immutable events,
`-0.0` read as `0.0`, and each record released once its event exists."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.persistence.jsonl._scan as jsonl_scan
import dsh.session.stored as stored_module
from dsh._lazy_json import LazyFrozenDict, LazyFrozenList
from dsh.json import FrozenDict, FrozenList
from dsh.persistence._validation import validate_log
from dsh.persistence.jsonl._format import LogContext
from dsh.session.events import SessionEvent
from dsh.session.fastcheck import FAST_LOG_ONLY
from dsh.session.stored import StoredEvents
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
    """A line spelling `-1e-400` (which parses to -0.0) is kept with `0.0`; its neighbour is kept as parsed."""
    line = b'{"type":"session/title","seq":0,"time":1,"data":{"x":-1e-400,"y":-5,"d":"2024-01-05"}}'
    plain = b'{"type":"session/title","seq":1,"time":1,"data":{"y":-5,"d":"2024-01-05","z":-0.5}}'
    scan = jsonl_scan.scan_events(line + b"\n" + plain + b"\n", 0, "none", LogContext("s1", None))
    first: Any = StoredEvents(scan.records, viewable=True)[0]
    assert math.copysign(1.0, first.data["x"]) == 1.0
    assert scan.records[1] == orjson.loads(plain)
    assert jsonl_scan.may_hold_negative_zero(line)
    assert not jsonl_scan.may_hold_negative_zero(plain)


async def test_a_full_read_parses_each_line_once_and_touching_parses_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scanning parses every line once and keeps the parse; touching every event parses nothing more."""
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
    # Every event line and the header line.
    assert scanned <= 1_200 + 1
    assert len(calls) == scanned


async def test_a_line_at_the_parsers_depth_limit_is_read(tmp_path: Path) -> None:
    """A line nested as deep as the parser allows is read and frozen all the way down."""
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
    """Only the chunk holding a record the scan was unsure of goes event by event; every event stays equal."""
    records = _notes(600)
    records[10] = {"type": "x/custom", "seq": 10, "time": 5, "data": {"n": [1]}, "ignorable": True}
    events, calls = await _touch_counting_per_event_views(tmp_path, monkeypatch, records)
    assert calls == list(range(512))
    assert events == records
    assert type(events[10].data) is FrozenDict  # an uncommon envelope is frozen whole
    for event in events:
        _assert_frozen_all_the_way(event)


def test_validation_takes_the_records_over_and_releases_each_once_frozen() -> None:
    """The validated events own the backend's records and drop each one as soon as its event exists."""
    from dsh.persistence.base import Revision, StoredLog

    records = _notes(3)
    log = StoredLog(
        header=stored_header("s1"),
        events=records,
        revision=Revision("r1"),
        verdicts=bytearray([FAST_LOG_ONLY] * 3),
        viewable=True,
    )
    validated = validate_log("s1", log, None)
    assert validated.events[1] == _notes(3)[1]
    assert validated.events._records[1] is None
    assert list(validated.events) == _notes(3)
    assert validated.events._records == [None] * 3


def test_the_scanner_keeps_each_record_as_parsed_with_its_verdict() -> None:
    """The scan result holds each record as the plain dict its one parse made, with its fast verdict."""
    records = _notes(4)
    text = b"".join(orjson.dumps(record) + b"\n" for record in records)
    scan = jsonl_scan.scan_events(text, 0, "none", LogContext("s1", None))
    assert scan.records == records
    assert [type(record) for record in scan.records] == [dict] * 4
    assert scan.verdicts == bytearray([FAST_LOG_ONLY] * 4)


def test_a_view_never_changes_the_callers_own_containers() -> None:
    """Reaching a child of a view copies it into a view of its own; the caller's dict keeps its type and content."""
    inner = {"b": [1, {"c": 2}]}
    view = LazyFrozenDict({"a": inner})
    child: Any = view["a"]
    assert type(child) is LazyFrozenDict
    assert type(inner) is dict
    assert type(inner["b"]) is list
    assert type(child["b"]) is LazyFrozenList
    assert type(inner["b"]) is list
    assert child == inner


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
        assert jsonl_scan.may_hold_negative_zero(text)
