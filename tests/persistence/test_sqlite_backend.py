"""SQLite backend operations: round trips, revisions, appends, corruption, typed reads, locks.

The backend is driven directly (no coordinator); raw connections look at the rows it leaves
(docs/storage-format.md#sqlite-schema).
"""

from __future__ import annotations

import asyncio
import math
import re
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.json import FrozenDict, FrozenList, freeze
from dsh.persistence.base import Capability, TornMarker
from dsh.persistence.errors import (
    AppendConflictError,
    LeaseHeldError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    SessionCorruptionError,
)
from dsh.persistence.sqlite import SqliteBackend
from dsh.persistence.sqlite import _backend as sqlite_backend
from dsh.session.events import KNOWN_EVENT_TYPES, SessionEvent, make_event
from dsh.session.header import SessionHeader, SessionId
from dsh.testing.io_faults import io_fault
from dsh.testing.sqlite_writer import RawText, SqliteStoredLogWriter
from tests.helpers import examples
from tests.persistence.helpers import raw_sql

pytestmark = pytest.mark.usefixtures("strict_sqlite_guard")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """The database file of the test."""
    return tmp_path / "sessions.sqlite3"


@pytest.fixture
async def backend(path: Path) -> AsyncIterator[SqliteBackend]:
    """An open backend over `path`."""
    async with SqliteBackend(path) as opened:
        yield opened


@pytest.fixture
def writer(path: Path) -> SqliteStoredLogWriter:
    """The fixture writer over `path`."""
    return SqliteStoredLogWriter(path)


def stored_header(
    session_id: str = "s1", *, parent: str | None = None, seed: int = 0, created_at: int = 1000
) -> FrozenDict:
    """The stored header record of a plain session (a subagent child when `parent` is given)."""
    return SessionHeader(
        version=0,
        id=SessionId(session_id),
        created_at=created_at,
        parent_session=SessionId(parent) if parent else None,
        is_seeded=seed > 0,
        origin="subagent" if parent else None,
    ).to_stored(seed)


def turn(start: int, turn_number: int = 0) -> list[SessionEvent]:
    """A closed turn of three events starting at seq `start`."""
    return [
        make_event("turn/start", start, 10 + start, freeze({"turn": turn_number})),
        make_event("session/title", start + 1, 11 + start, freeze({"title": f"t{turn_number}"})),
        make_event("turn/end", start + 2, 12 + start, freeze({"turn": turn_number, "reason": {"kind": "completed"}})),
    ]


async def materialize(backend: SqliteBackend, session_id: str = "s1", **kwargs: Any) -> str:
    """Store one closed turn for a new session and return the revision."""
    return await backend.append_batch(stored_header(session_id, **kwargs), turn(0), materialized=False, fence=None)


# --------------------------------------------------------------------------------------------------
# Round trips


async def test_data_column_holds_the_exact_orjson_text_and_loads_back_byte_identical(
    backend: SqliteBackend, path: Path
) -> None:
    """`events.data` is exactly `orjson.dumps(data)`, and a load reproduces those bytes and the key order."""
    payloads = [
        {"z": 1, "a": [0.1, 1e100, -2.5e-7, 2**53 - 1], "m": {"b": None, "a": True}},
        {"text": 'emoji \U0001f600 line\u2028sep\u2029 quote" back\\ tab\t nul\u0000 é'},
        {"big": "x" * 70_000, "nested": [[[[{"k": []}]]]]},
    ]
    events = [
        make_event("user/x" if i == 1 else "acme/note", i, 2**53 - 1, freeze(data), ignorable=True)
        for i, data in enumerate(payloads)
    ]
    await backend.append_batch(stored_header(), events, materialized=False, fence=None)
    columns = await raw_sql(path, lambda conn: conn.execute("SELECT data FROM events ORDER BY seq").fetchall())
    assert [text for (text,) in columns] == [orjson.dumps(event["data"]).decode() for event in events]
    log = await backend.load("s1")
    assert log is not None
    assert [orjson.dumps(record) for record in log.events] == [orjson.dumps(event) for event in events]
    assert [orjson.dumps(record["data"]) for record in log.events] == [orjson.dumps(p) for p in payloads]


_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53 - 1), 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0.0 and math.copysign(1.0, f) < 0))
    | st.text()
)
_JSON = st.recursive(
    _JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4)
)


@pytest.mark.slow
@settings(max_examples=examples(25), deadline=None)
@given(payload=st.dictionaries(st.text(), _JSON, max_size=5))
def test_any_json_payload_round_trips_byte_identically(payload: dict[str, Any]) -> None:
    """Property: for any lossless JSON object, the stored column and the reloaded data are the original orjson bytes."""

    async def check() -> None:
        event = make_event("acme/any", 0, 0, freeze(payload), ignorable=True)
        async with SqliteBackend(":memory:") as backend:
            await backend.append_batch(stored_header(), [event], materialized=False, fence=None)
            log = await backend.load("s1")
        assert log is not None
        assert orjson.dumps(log.events[0]["data"]) == orjson.dumps(event["data"])
        assert log.events[0]["data"] == payload

    asyncio.run(check())


async def test_events_are_rebuilt_in_canonical_key_order_with_optional_keys(backend: SqliteBackend) -> None:
    """Loaded records use the order type, seq, time, data, ignorable, sourceEventSeqs, surfaceOp."""
    message = {
        "turn": 0,
        "step": 0,
        "message": {"id": "m1", "role": "assistant", "content": [], "source": {"kind": "model"}},
    }
    events = [
        make_event("turn/start", 0, 1, freeze({"turn": 0})),
        make_event(
            "assistant/message",
            1,
            2,
            freeze(message),
            source_event_seqs=FrozenList(),
            surface_op="append",
        ),
        make_event("acme/y", 2, 3, freeze({}), ignorable=True),
        make_event(
            "assistant/message",
            3,
            4,
            freeze(message),
            source_event_seqs=FrozenList([1]),
            surface_op=freeze({"op": "replace", "start": 1, "end": 1}),
        ),
    ]
    await backend.append_batch(stored_header(), events, materialized=False, fence=None)
    log = await backend.load("s1")
    assert log is not None
    assert [list(record) for record in log.events] == [
        ["type", "seq", "time", "data"],
        ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"],
        ["type", "seq", "time", "data", "ignorable"],
        ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"],
    ]
    assert log.events == [dict(event) for event in events]
    assert log.events[1]["sourceEventSeqs"] == []  # '[]' stays distinct from absent


async def test_header_record_is_rebuilt_in_upstream_key_order(backend: SqliteBackend, path: Path) -> None:
    """Listing and loading rebuild the stored header with the upstream key order and omit seedLength 0."""
    full = FrozenDict(
        {
            "type": "session",
            "version": 0,
            "id": "child",
            "createdAt": 7,
            "cwd": "/srv/x y",
            "parentSession": "p",
            "seedLength": 3,
            "origin": "subagent",
            "delegationDepth": 2,
            "agentPreset": "coder",
        }
    )
    await backend.append_batch(full, turn(0), materialized=False, fence=None)
    await materialize(backend, "plain")
    (rows, damaged) = await backend.list_headers()
    assert damaged == []
    by_id = {row.record["id"]: row.record for row in rows}
    assert list(by_id["child"].items()) == list(full.items())
    assert list(by_id["plain"]) == ["type", "version", "id", "createdAt", "delegationDepth"]
    seed_columns = await raw_sql(path, lambda conn: conn.execute("SELECT id, seed_length FROM sessions").fetchall())
    assert dict(seed_columns) == {"child": 3, "plain": 0}
    log = await backend.load("child")
    assert log is not None
    assert list(log.header.items()) == list(full.items())


async def test_list_headers_sorts_by_created_at_then_id_and_filters_direct_children(backend: SqliteBackend) -> None:
    """Rows come sorted by (created_at, id) by code point; a parent filter keeps direct children only."""
    await materialize(backend, "p", created_at=1)
    await materialize(backend, "b", parent="p", created_at=5)
    await materialize(backend, "\u00e9", parent="p", created_at=5)
    await materialize(backend, "a", parent="p", created_at=9)
    await materialize(backend, "grandchild", parent="b", created_at=2)
    await materialize(backend, "other", created_at=0)
    await materialize(backend, "\U00010000", created_at=20)  # code point order, not UTF-16 order
    await materialize(backend, "\uffff", created_at=20)
    everyone, _ = await backend.list_headers()
    expected = ["other", "p", "grandchild", "b", "\u00e9", "a", "\uffff", "\U00010000"]
    assert [row.record["id"] for row in everyone] == expected
    children, _ = await backend.list_headers(parents=frozenset({"p"}))
    assert [row.record["id"] for row in children] == ["b", "\u00e9", "a"]
    assert await backend.list_headers(parents=frozenset({"nobody"})) == ([], [])


# --------------------------------------------------------------------------------------------------
# Revisions


async def test_revisions_agree_across_reads_and_change_with_every_append(backend: SqliteBackend) -> None:
    """list, load, load_typed and read_revision agree; each append bumps the counter of the same incarnation."""
    first = await materialize(backend)
    match = re.fullmatch(r"sqlite:([0-9a-f-]{36}):([0-9a-f]{32}):(\d+)", first)
    assert match is not None
    assert match.group(3) == "1"
    rows, _ = await backend.list_headers()
    log = await backend.load("s1")
    typed = await backend.load_typed("s1", frozenset({"turn/end"}), 0, KNOWN_EVENT_TYPES)
    assert log is not None
    assert typed is not None
    assert rows[0].revision == log.revision == typed.revision == await backend.read_revision("s1") == first
    second = await backend.append_batch(stored_header(), turn(3, 1), materialized=True, fence=None)
    assert second != first
    assert second.rsplit(":", 1)[0] == first.rsplit(":", 1)[0]
    assert second.endswith(":2")
    assert await backend.read_revision("s1") == second
    assert await backend.read_revision("missing") is None


async def test_identical_content_in_two_stores_never_shares_a_revision(tmp_path: Path) -> None:
    """Two independent stores with the same content report different revisions (store id + incarnation)."""
    async with SqliteBackend(tmp_path / "a.sqlite3") as one, SqliteBackend(tmp_path / "b.sqlite3") as two:
        first, second = await materialize(one), await materialize(two)
        assert first != second
        assert first.split(":")[1] != second.split(":")[1]  # different store ids


async def test_rewriting_a_session_changes_its_incarnation(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A session stored again from scratch gets a new incarnation, so its revision never repeats."""
    before = await materialize(backend)
    await writer.write("s1", stored_header(), [dict(event) for event in turn(0)])
    after = await backend.read_revision("s1")
    assert after is not None
    assert after.split(":")[2] != before.split(":")[2]
    assert after != before


# --------------------------------------------------------------------------------------------------
# Appends


async def test_append_seq_mismatch_is_refused_before_anything_changes(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """With a stored next seq of 5, a batch starting at 4 or 6 is APPEND_SEQ_MISMATCH and nothing changes."""
    events = [
        *turn(0),
        make_event("turn/start", 3, 20, freeze({"turn": 1})),
        make_event("step/start", 4, 21, freeze({"turn": 1, "step": 0})),
    ]
    await backend.append_batch(stored_header(), events, materialized=False, fence=None)
    before = (await writer.snapshot("s1"), await backend.read_revision("s1"))
    for start in (4, 6):
        batch = [make_event("step/end", start, 30, freeze({"turn": 1, "step": 0}))]
        with pytest.raises(AppendConflictError) as caught:
            await backend.append_batch(stored_header(), batch, materialized=True, fence=None)
        assert caught.value.code == "APPEND_SEQ_MISMATCH"
        assert (await writer.snapshot("s1"), await backend.read_revision("s1")) == before


async def test_non_contiguous_batch_is_refused_whole(backend: SqliteBackend, writer: SqliteStoredLogWriter) -> None:
    """A batch whose own seqs skip is refused before the transaction, leaving the log unchanged."""
    await materialize(backend)
    before = await writer.snapshot("s1")
    batch = [make_event("turn/start", 3, 1, freeze({"turn": 1})), make_event("turn/end", 5, 2, freeze({"turn": 1}))]
    with pytest.raises(AppendConflictError):
        await backend.append_batch(stored_header(), batch, materialized=True, fence=None)
    assert await writer.snapshot("s1") == before


async def test_materializing_a_stored_id_is_already_exists(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A first batch for an id that is already stored is SESSION_ALREADY_EXISTS and writes nothing."""
    await materialize(backend)
    before = await writer.snapshot("s1")
    with pytest.raises(SessionAlreadyExistsError):
        await backend.append_batch(stored_header(), turn(0), materialized=False, fence=None)
    assert await writer.snapshot("s1") == before


async def test_append_to_an_unstored_session_is_a_conflict(backend: SqliteBackend) -> None:
    """A non-first batch for an id with nothing stored is refused and materializes nothing."""
    with pytest.raises(AppendConflictError):
        await backend.append_batch(stored_header(), turn(0), materialized=True, fence=None)
    assert not await backend.exists("s1")


async def test_batch_is_all_or_nothing_under_an_injected_fault(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A fault after half the rows, or at commit, rolls the batch back; the retry stores it once with no gap."""
    await materialize(backend)
    for kind in ("partial-write", "sync", "rollback"):
        before = (await writer.snapshot("s1"), await backend.read_revision("s1"))
        with io_fault(backend, kind, PersistenceIOError(f"injected {kind}")) as shot:
            with pytest.raises(PersistenceIOError, match=f"injected {kind}"):
                await backend.append_batch(stored_header(), turn(3, 1), materialized=True, fence=None)
        assert shot.struck
        assert (await writer.snapshot("s1"), await backend.read_revision("s1")) == before
    await backend.append_batch(stored_header(), turn(3, 1), materialized=True, fence=None)
    log = await backend.load("s1")
    assert log is not None
    assert [record["seq"] for record in log.events] == list(range(6))


async def test_a_failed_first_batch_materializes_nothing(backend: SqliteBackend) -> None:
    """A fault during materialization leaves no sessions row: nothing exists before the first batch."""
    with io_fault(backend, "sync", PersistenceIOError("injected")), pytest.raises(PersistenceIOError):
        await materialize(backend)
    assert not await backend.exists("s1")
    assert await backend.list_headers() == ([], [])


async def test_commit_repair_appends_the_closers_as_one_batch(backend: SqliteBackend) -> None:
    """Repair appends the closers (no torn tail in a transactional store) and changes the revision."""
    open_turn = [
        make_event("turn/start", 0, 1, freeze({"turn": 0})),
        make_event("step/start", 1, 2, freeze({"turn": 0, "step": 0})),
    ]
    before = await backend.append_batch(stored_header(), open_turn, materialized=False, fence=None)
    log = await backend.load("s1")
    assert log is not None
    assert log.torn is None
    closers = [
        make_event("step/end", 2, 2, freeze({"turn": 0, "step": 0})),
        make_event("turn/end", 3, 2, freeze({"turn": 0, "reason": {"kind": "interrupted"}})),
    ]
    after = await backend.commit_repair(stored_header(), None, closers, fence=None)
    assert after != before
    log = await backend.load("s1")
    assert log is not None
    assert [record["type"] for record in log.events] == ["turn/start", "step/start", "step/end", "turn/end"]
    assert await backend.commit_repair(stored_header(), None, [], fence=None) == after
    with pytest.raises(ValueError, match="torn"):
        await backend.commit_repair(stored_header(), TornMarker(0), closers, fence=None)


# --------------------------------------------------------------------------------------------------
# Corruption and refusals


async def test_undecodable_data_row_is_corrupt(backend: SqliteBackend, writer: SqliteStoredLogWriter) -> None:
    """A row whose `data` is not JSON makes the load SESSION_CORRUPT; the header stays listable."""
    records = [dict(event) for event in turn(0)]
    records[1]["data"] = RawText('{"title": ')
    await writer.write("s1", stored_header(), records)
    with pytest.raises(SessionCorruptionError) as caught:
        await backend.load("s1")
    assert caught.value.code == "SESSION_CORRUPT"
    assert caught.value.session_id == "s1"
    rows, _ = await backend.list_headers()
    assert [row.record["id"] for row in rows] == ["s1"]


async def test_seq_gap_is_corrupt(backend: SqliteBackend, writer: SqliteStoredLogWriter) -> None:
    """Rows that skip a seq break contiguity: SESSION_CORRUPT (a transactional store has no torn tails)."""
    records = [dict(event) for event in turn(0)]
    records[2] = {**records[2], "seq": 3}
    await writer.write("s1", stored_header(), records)
    with pytest.raises(SessionCorruptionError, match="seq gap"):
        await backend.load("s1")


async def test_next_seq_disagreeing_with_rows_is_corrupt(backend: SqliteBackend, writer: SqliteStoredLogWriter) -> None:
    """A sessions row promising more events than stored (a lost tail) is SESSION_CORRUPT on full and typed reads."""
    await materialize(backend)
    await writer.execute("UPDATE sessions SET next_seq = 5 WHERE id = 's1'")
    with pytest.raises(SessionCorruptionError):
        await backend.load("s1")
    with pytest.raises(SessionCorruptionError):
        await backend.load_typed("s1", frozenset({"turn/end"}), 0, KNOWN_EVENT_TYPES)


async def test_foreign_version_is_returned_without_decoding_rows(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A header with version 1 comes back with its rows unread, so the verdict is a version refusal, not corruption."""
    header = FrozenDict({**stored_header(), "version": 1})
    await writer.write("s1", header, [{"type": "turn/start", "seq": 0, "time": 1, "data": RawText("<v1 encoding>")}])
    for log in (await backend.load("s1"), await backend.load_typed("s1", None, 0, KNOWN_EVENT_TYPES)):
        assert log is not None
        assert log.header["version"] == 1
        assert log.events == []


async def test_integer_outside_64_bits_is_flagged(backend: SqliteBackend, writer: SqliteStoredLogWriter) -> None:
    """`oversized_int_at` names the first record whose stored JSON holds an integer outside signed 64 bits."""
    records = [dict(event) for event in turn(0)]
    records[1]["data"] = RawText('{"title": "1234567890123456789012345", "n": 9223372036854775807}')
    records[2]["data"] = RawText('{"turn": 0, "reason": {"kind": "completed"}, "n": 18446744073709551616}')
    await writer.write("s1", stored_header(), records)
    log = await backend.load("s1")
    assert log is not None
    assert log.oversized_int_at == 2
    typed = await backend.load_typed("s1", frozenset({"turn/end"}), 0, KNOWN_EVENT_TYPES)
    assert typed is not None
    assert typed.oversized_int_at == 0


# --------------------------------------------------------------------------------------------------
# Typed reads


def descriptor_log() -> list[dict[str, Any]]:
    """Ten records: turns, descriptors and an ignorable foreign event."""
    records: list[dict[str, Any]] = []
    for number in range(2):
        base = number * 5
        records += [
            {"type": "turn/start", "seq": base, "time": base, "data": {"turn": number}},
            {"type": "subagent/descriptor", "seq": base + 1, "time": base, "data": {"v": number}},
            {"type": "acme/trace", "seq": base + 2, "time": base, "data": {}, "ignorable": True},
            {"type": "session/title", "seq": base + 3, "time": base, "data": {"title": "x"}},
            {
                "type": "turn/end",
                "seq": base + 4,
                "time": base,
                "data": {"turn": number, "reason": {"kind": "completed"}},
            },
        ]
    return records


async def test_typed_read_returns_only_matching_rows_and_the_stored_next_seq(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A typed read returns the matching rows from `from_seq` in seq order, with `next_seq` and the revision."""
    records = descriptor_log()
    await writer.write("s1", stored_header(), records)
    wanted = frozenset({"subagent/descriptor", "turn/end"})
    typed = await backend.load_typed("s1", wanted, 2, KNOWN_EVENT_TYPES)
    full = await backend.load("s1")
    assert typed is not None
    assert full is not None
    assert typed.events == [r for r in full.events if r["seq"] >= 2 and r["type"] in wanted]
    assert [r["seq"] for r in typed.events] == [4, 6, 9]
    assert typed.next_seq == 10
    assert typed.revision == full.revision
    assert typed.first_unknown is None
    everything = await backend.load_typed("s1", None, 7, KNOWN_EVENT_TYPES)
    assert everything is not None
    assert [r["seq"] for r in everything.events] == [7, 8, 9]
    nothing = await backend.load_typed("s1", frozenset(), 0, KNOWN_EVENT_TYPES)
    assert nothing is not None
    assert nothing.events == []
    assert nothing.next_seq == 10
    assert await backend.load_typed("missing", wanted, 0, KNOWN_EVENT_TYPES) is None


async def test_typed_read_never_decodes_rows_of_other_types(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """A damaged row of an unrequested type does not affect a typed read (only matching rows are read)."""
    records = descriptor_log()
    records[3]["data"] = RawText("not json")
    await writer.write("s1", stored_header(), records)
    typed = await backend.load_typed("s1", frozenset({"subagent/descriptor"}), 0, KNOWN_EVENT_TYPES)
    assert typed is not None
    assert [r["data"] for r in typed.events] == [{"v": 0}, {"v": 1}]
    with pytest.raises(SessionCorruptionError):
        await backend.load_typed("s1", frozenset({"session/title"}), 0, KNOWN_EVENT_TYPES)


async def test_typed_read_reports_the_first_unknown_non_ignorable_type_in_the_whole_log(
    backend: SqliteBackend, writer: SqliteStoredLogWriter
) -> None:
    """`first_unknown` is the earliest non-ignorable unknown (type, seq) anywhere, found by the type skip-scan."""
    records = descriptor_log()
    records[7] = {"type": "zeta/new", "seq": 7, "time": 0, "data": {}}
    records[8] = {"type": "alpha/new", "seq": 8, "time": 0, "data": {}}
    records[3] = {"type": "zeta/new", "seq": 3, "time": 0, "data": {}, "ignorable": True}
    await writer.write("s1", stored_header(), records)
    typed = await backend.load_typed("s1", frozenset({"turn/end"}), 9, KNOWN_EVENT_TYPES)
    assert typed is not None
    assert typed.first_unknown == ("zeta/new", 7)
    assert [r["seq"] for r in typed.events] == [9]
    widened = await backend.load_typed("s1", frozenset({"turn/end"}), 0, KNOWN_EVENT_TYPES | {"zeta/new"})
    assert widened is not None
    assert widened.first_unknown == ("alpha/new", 8)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every SQL statement run by connections opened from now on (expanded, via the trace callback)."""
    captured: list[str] = []
    original = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = original(*args, **kwargs)
        conn.set_trace_callback(captured.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    return captured


async def explain(path: Path, sql: str) -> str:
    """The EXPLAIN QUERY PLAN details of `sql`, joined."""
    rows = await raw_sql(path, lambda conn: conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall())
    return " | ".join(str(row[3]) for row in rows)


async def test_typed_reads_and_parent_listings_use_their_indexes(
    path: Path, writer: SqliteStoredLogWriter, statements: list[str]
) -> None:
    """A typed read's and a parent listing's statements are planned on events_by_type / sessions_by_parent."""
    async with SqliteBackend(path) as backend:
        await writer.write("s1", stored_header(), descriptor_log())
        await materialize(backend, "child", parent="s1")
        statements.clear()
        await backend.load_typed("s1", frozenset({"subagent/descriptor", "turn/end"}), 2, KNOWN_EVENT_TYPES)
        typed_sql = [s for s in statements if "FROM events" in s and "type IN" in s]
        skip_sql = [s for s in statements if "type >" in s]
        statements.clear()
        await backend.list_headers(parents=frozenset({"s1"}))
        parent_sql = [s for s in statements if "parent_session =" in s]
    assert len(typed_sql) == 1
    assert "events_by_type" in await explain(path, typed_sql[0])
    assert skip_sql
    for sql in skip_sql:
        assert "events_by_type" in await explain(path, sql)
    assert len(parent_sql) == 1
    assert "sessions_by_parent" in await explain(path, parent_sql[0])


# --------------------------------------------------------------------------------------------------
# Writer locks, readers, misc


async def test_writer_lock_excludes_a_second_backend_instance_until_released(path: Path) -> None:
    """acquire takes `<db>.locks/<id>.lock`; another instance gets SESSION_LEASE_HELD until release."""
    async with SqliteBackend(path) as one, SqliteBackend(path) as two:
        assert await one.acquire("a/b") is None
        assert (path.parent / "sessions.sqlite3.locks" / "a~002Fb.lock").is_file()
        with pytest.raises(LeaseHeldError) as caught:
            await two.acquire("a/b")
        assert caught.value.code == "SESSION_LEASE_HELD"
        assert caught.value.holder
        await one.release("a/b")
        await two.acquire("a/b")
        await two.release("a/b")
        await one.acquire("a/b")
    async with SqliteBackend(path) as three:  # closing released every lock
        await three.acquire("a/b")


async def test_reads_proceed_while_another_connection_holds_the_write_lock(backend: SqliteBackend, path: Path) -> None:
    """WAL readers see the last committed state while another writer's transaction is open, without waiting."""
    revision = await materialize(backend)

    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE sessions SET revision = 99")
            held.set()
            done.wait(30)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    async with SqliteBackend(path, busy_timeout_ms=0) as impatient:
        holder = asyncio.create_task(asyncio.to_thread(hold))
        try:
            assert await asyncio.to_thread(held.wait, 30)
            assert await impatient.read_revision("s1") == revision
            log = await impatient.load("s1")
            assert log is not None
            assert len(log.events) == 3
        finally:
            done.set()
            await holder


def test_backend_declares_typed_reads_and_has_no_artifact_paths() -> None:
    """The backend is named `sqlite`, declares TYPED_READS and EAGER_APPENDS, and `locate` returns None."""
    backend = SqliteBackend(":memory:")
    assert backend.name == "sqlite"
    assert backend.capabilities == frozenset({Capability.TYPED_READS, Capability.EAGER_APPENDS})
    assert backend.locate(stored_header()) is None


async def test_driver_errors_are_translated_to_persistence_io(backend: SqliteBackend, path: Path) -> None:
    """A driver error (a table dropped behind the backend's back) surfaces as PERSISTENCE_IO with its cause."""
    await materialize(backend)
    await raw_sql(path, lambda conn: conn.execute("DROP TABLE events"))
    with pytest.raises(PersistenceIOError) as caught:
        await backend.load("s1")
    assert caught.value.code == "PERSISTENCE_IO"
    assert caught.value.session_id == "s1"
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


async def test_several_parents_are_one_indexed_in_list_and_chunked(
    path: Path, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`parents={...}` binds the ids in `IN (...)` chunks, each planned on sessions_by_parent, and merges the order."""
    monkeypatch.setattr(sqlite_backend, "_IN_CHUNK", 3)
    async with SqliteBackend(path) as backend:
        for index in range(8):
            await materialize(backend, f"p{index}")
            await materialize(backend, f"c{index}", parent=f"p{index}", created_at=1000 - index)
        await materialize(backend, "grandchild", parent="c0")
        statements.clear()
        parents = frozenset({f"p{index}" for index in range(7)} | {"nobody"})
        rows, damaged = await backend.list_headers(parents=parents)
        in_sql = [s for s in statements if "parent_session IN" in s]
        orphans, _ = await backend.list_headers(parents=frozenset({None}))
        none_at_all = await backend.list_headers(parents=frozenset())
    assert [row.record["id"] for row in rows] == [f"c{index}" for index in reversed(range(7))]
    assert damaged == []
    assert len(in_sql) == 3
    for sql in in_sql:
        assert "sessions_by_parent" in await explain(path, sql)
    assert sorted(row.record["id"] for row in orphans) == [f"p{index}" for index in range(8)]
    assert none_at_all == ([], [])
