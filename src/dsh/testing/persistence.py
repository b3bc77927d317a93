"""The shared persistence conformance suite, run against every storage backend.

Layer: testing (shipped, importable; needs `pytest` and `pytest-asyncio`). A backend proves itself by
subclassing `PersistenceConformance` in about ten lines and providing one fixture, `target`, that
returns a `ConformanceTarget`: a factory of backend instances over one storage, a
`StoredLogWriter` for that storage, and a name. Every test drives a real `PersistenceCoordinator`
over the backend (wrapped in a counting `FaultyBackend`) and a real `SessionStore`; write-behind
tests drive the injected `ManualTimer`, never the loop clock. Required tests never skip.

```python
class TestMemoryConformance(PersistenceConformance):
    __test__ = True

    @pytest.fixture
    def target(self) -> ConformanceTarget:
        storage = MemoryStorage()
        return ConformanceTarget(lambda: MemoryBackend(storage), MemoryStoredLogWriter(storage), "memory")
```
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import pytest
import pytest_asyncio

from dsh.persistence.base import PersistenceObservation, StoredSessionInfo
from dsh.persistence.errors import (
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionNotFoundError,
)
from dsh.session.header import HeaderInit
from dsh.session.session import Session
from dsh.testing.conformance_harness import (
    ConformanceHarness,
    closed_turn_records,
    encoded,
    eventually,
    note_records,
)
from dsh.testing.conformance_writes import WriteConformance
from dsh.testing.stored_logs import (
    BASE_TIME_MS,
    ConformanceTarget,
    MemoryStoredLogWriter,
    StoredLogWriter,
    append_closed_turn,
    append_every_core_type,
    append_open_step,
    build_records,
    encode_record,
    stored_header,
    write_stored_log,
)

__all__ = [
    "ConformanceHarness",
    "ConformanceTarget",
    "MemoryStoredLogWriter",
    "PersistenceConformance",
    "StoredLogWriter",
    "WriteConformance",
    "eventually",
    "write_stored_log",
]


class PersistenceConformance(WriteConformance):
    """The whole conformance suite; the write-path tests are inherited from `WriteConformance`.

    Defined here: round trips, listing, revisions, crash repair, resume, forks, format refusals,
    typed reads and immutability of observations.

    Subclass it, set `__test__ = True`, and provide the `target` fixture.
    """

    __test__: ClassVar[bool] = False
    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    @pytest.fixture
    def target(self) -> ConformanceTarget:
        """The backend under test; every subclass overrides this fixture."""
        pytest.fail(f"{type(self).__name__} must provide a `target` fixture returning a ConformanceTarget")

    @pytest_asyncio.fixture
    async def harness(self, target: ConformanceTarget) -> AsyncIterator[ConformanceHarness]:
        """A harness with one opened coordinator; everything is closed at teardown."""
        harness = ConformanceHarness(target)
        await harness.open()
        try:
            yield harness
        finally:
            await harness.aclose()

    # ------------------------------------------------------------------ round trips and listing

    async def test_header_and_every_core_type_round_trip(self, harness: ConformanceHarness) -> None:
        """A flushed, disposed session reads back with an equal header and byte-equal events."""
        init = HeaderInit(
            cwd="/srv/project", agent_preset="coder", delegation_depth=2, origin="subagent", parent_session="p01"
        )
        session = harness.store.create("s01", header=init)
        append_every_core_type(session)
        await harness.store.flush(session)
        await harness.cold(session)
        observation = await harness.coordinator.inspect("s01")
        assert observation.header == session.header
        assert observation.inherited_event_count == 0
        assert observation.live is False
        assert observation.synthetic_tail == 0
        assert encoded(observation.events) == encoded(session.events)

    async def test_session_without_events_never_materializes(self, harness: ConformanceHarness) -> None:
        """A published session that never appended is absent from list() and not found."""
        session = harness.store.create("s02")
        await harness.cold(session)
        listing = await harness.coordinator.list()
        assert "s02" not in [row.header.id for row in listing]
        with pytest.raises(SessionNotFoundError) as caught:
            await harness.coordinator.inspect("s02")
        assert caught.value.code == "SESSION_NOT_FOUND"

    async def test_listing_shows_is_seeded_never_the_cut(self, harness: ConformanceHarness) -> None:
        """Listed headers carry is_seeded True for a fork child, False otherwise, and no integer cut."""
        parent = harness.store.create("p03")
        append_closed_turn(parent, 1)
        await harness.store.flush(parent)
        child = harness.store.fork(parent, child_id="c03")
        await harness.store.flush(child)
        listing = await harness.coordinator.list()
        rows: dict[str, StoredSessionInfo] = {row.header.id: row for row in listing}
        assert rows["p03"].header.is_seeded is False
        assert rows["c03"].header.is_seeded is True
        for row in rows.values():
            assert not hasattr(row, "inherited_event_count")
            assert "seedLength" not in row.header.to_json()

    async def test_damaged_events_are_listed_but_corrupt_on_read(self, harness: ConformanceHarness) -> None:
        """A session whose event region is damaged still lists; inspect raises SESSION_CORRUPT."""
        await write_stored_log(harness.writer, "s04", closed_turn_records())
        await harness.writer.damage_events("s04")
        listing = await harness.coordinator.list()
        assert "s04" in [row.header.id for row in listing]
        with pytest.raises(SessionCorruptionError) as caught:
            await harness.coordinator.inspect("s04")
        assert caught.value.code == "SESSION_CORRUPT"

    async def test_parent_filter_keeps_direct_children_sorted(self, harness: ConformanceHarness) -> None:
        """list(parent_session=p) returns exactly p's direct children, sorted by (created_at, id)."""
        records = closed_turn_records()
        await write_stored_log(harness.writer, "p05", records, created_at=BASE_TIME_MS)
        children = [("k3", 100), ("k1", 200), ("k2", 200)]
        for child_id, offset in children:
            await write_stored_log(
                harness.writer, child_id, records, created_at=BASE_TIME_MS + offset, parentSession="p05"
            )
        await write_stored_log(harness.writer, "u05", records, created_at=BASE_TIME_MS + 50)
        await write_stored_log(harness.writer, "g05", records, created_at=BASE_TIME_MS + 60, parentSession="k1")
        listing = await harness.coordinator.list(parent_session="p05")
        assert [row.header.id for row in listing] == ["k3", "k1", "k2"]
        everything = await harness.coordinator.list()
        ids = [row.header.id for row in everything]
        assert ids == ["p05", "u05", "g05", "k3", "k1", "k2"]

    async def test_several_parents_filter_keeps_their_direct_children_sorted(self, harness: ConformanceHarness) -> None:
        """list(parents={a, b}) returns the direct children of a and b, merged and sorted by (created_at, id)."""
        records = closed_turn_records()
        await write_stored_log(harness.writer, "pa", records, created_at=BASE_TIME_MS)
        await write_stored_log(harness.writer, "pb", records, created_at=BASE_TIME_MS + 1)
        children = [("a2", 300, "pa"), ("b1", 100, "pb"), ("a1", 100, "pa"), ("b2", 200, "pb"), ("c1", 150, "pc")]
        for child_id, offset, parent in children:
            await write_stored_log(
                harness.writer, child_id, records, created_at=BASE_TIME_MS + offset, parentSession=parent
            )
        await write_stored_log(harness.writer, "g1", records, created_at=BASE_TIME_MS + 50, parentSession="a1")
        listing = await harness.coordinator.list(parents={"pa", "pb"})
        assert [row.header.id for row in listing] == ["a1", "b1", "b2", "a2"]
        assert listing.damaged == []
        parentless = await harness.coordinator.list(parents=[None, "a1"])
        assert [row.header.id for row in parentless] == ["pa", "pb", "g1"]
        assert (await harness.coordinator.list(parents=set())).rows == []
        assert (await harness.coordinator.list(parents={"nobody"})).rows == []

    async def test_revisions_agree_across_reads_and_change_on_append(self, harness: ConformanceHarness) -> None:
        """list, inspect and revision() agree; an append changes it; independent stores differ."""
        records = note_records(7)
        await write_stored_log(harness.writer, "s06", records[:6])
        coordinator = harness.coordinator

        async def listed() -> str:
            rows = [row for row in await coordinator.list() if row.header.id == "s06"]
            return rows[0].revision

        first = await listed()
        assert await listed() == first
        assert (await coordinator.inspect("s06")).revision == first
        assert await coordinator.revision("s06") == first
        await harness.writer.append("s06", records[6:])
        changed = await coordinator.revision("s06")
        assert changed is not None
        assert changed != first
        assert await listed() == changed
        observation = await coordinator.inspect("s06")
        assert observation.revision == changed
        assert len(observation.events) == 7
        if harness.target.independent is not None:
            other = harness.target.independent()
            await write_stored_log(other.writer, "s06", records)
            backend = other.make_backend()
            await backend.open()
            try:
                assert await backend.read_revision("s06") not in (None, first, changed)
            finally:
                await backend.close()

    # ------------------------------------------------------------------ crash repair

    async def test_inspect_closes_open_turn_in_memory_only(self, harness: ConformanceHarness) -> None:
        """inspect balances an open step in memory; stored bytes and revision stay unchanged."""
        await write_stored_log(harness.writer, "s07", build_records(lambda s: append_open_step(s, 1)))
        before = await harness.writer.snapshot("s07")
        revision = await harness.coordinator.revision("s07")
        observation = await harness.coordinator.inspect("s07")
        assert [event.type for event in observation.events[-2:]] == ["step/end", "turn/end"]
        assert observation.events[-1].data == {"turn": 1, "reason": {"kind": "interrupted"}}
        assert observation.synthetic_tail == 2
        assert len(observation.events) == 5
        assert observation.revision == revision
        assert await harness.coordinator.revision("s07") == revision
        assert await harness.writer.snapshot("s07") == before

    async def test_prepare_stores_the_closers(self, harness: ConformanceHarness) -> None:
        """prepare stores the closers, changes the revision, and resumes with end-seed at the cut."""
        await write_stored_log(harness.writer, "s08", build_records(lambda s: append_open_step(s, 1)))
        before = await harness.coordinator.revision("s08")
        prepared = await harness.coordinator.prepare("s08")
        async with prepared:
            assert prepared.observation.revision != before
            assert prepared.observation.synthetic_tail == 0
            assert prepared.session.first_live_seq == 5
            assert prepared.session.events[5].type == "session/end-seed"
        observation = await harness.coordinator.inspect("s08")
        assert observation.synthetic_tail == 0
        assert observation.revision == prepared.observation.revision
        stored = await harness.coordinator.read_events("s08")
        assert [event.type for event in stored.events[3:]] == ["step/end", "turn/end"]
        assert stored.next_seq == 5

    async def test_pending_tool_calls_get_results_before_step_end(self, harness: ConformanceHarness) -> None:
        """prepare stores TOOL_OUTCOME_UNKNOWN (citing the call seq) and TOOL_NOT_STARTED results."""
        records = build_records(lambda s: append_open_step(s, 1, calls=["c-ran", "c-new"], started=["c-ran"]))
        await write_stored_log(harness.writer, "s09", records)
        call_seq = next(record["seq"] for record in records if record["type"] == "tool/call")
        async with await harness.coordinator.prepare("s09"):
            pass
        stored = await harness.coordinator.read_events("s09")
        tail = list(stored.events[len(records) :])
        assert [event.type for event in tail] == ["tool/result", "tool/result", "step/end", "turn/end"]
        ran, new = tail[0], tail[1]
        ran_data: Any = ran.data
        new_data: Any = new.data
        assert ran_data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert ran.source_event_seqs == [call_seq]
        assert new_data["error"]["code"] == "TOOL_NOT_STARTED"
        assert new.source_event_seqs is None

    async def test_live_inspect_reads_nothing(self, harness: ConformanceHarness) -> None:
        """inspect of a live session with an open turn is the live view with zero backend reads."""
        session = harness.store.create("s10")
        append_open_step(session, 1)
        observation = await harness.coordinator.inspect("s10")
        assert observation.live is True
        assert observation.revision is None
        assert observation.synthetic_tail == 0
        assert list(observation.events) == list(session.events)
        assert harness.backend.reads == 0
        assert harness.backend.calls["read_revision"] == 0

    async def test_prepare_refuses_live_and_unknown_ids(self, harness: ConformanceHarness) -> None:
        """prepare of a live id raises SESSION_LIVE; unknown ids raise SESSION_NOT_FOUND."""
        harness.store.create("s11")
        with pytest.raises(SessionLiveError) as live:
            await harness.coordinator.prepare("s11")
        assert live.value.code == "SESSION_LIVE"
        with pytest.raises(SessionNotFoundError):
            await harness.coordinator.inspect("missing")
        with pytest.raises(SessionNotFoundError):
            await harness.coordinator.prepare("missing")
        with pytest.raises(SessionNotFoundError):
            await harness.coordinator.read_events("missing")

    async def test_resumed_appends_follow_the_end_seed(self, harness: ConformanceHarness) -> None:
        """A resumed log stores old log + end-seed + new events, contiguous, header and cut kept."""
        records = closed_turn_records()
        await write_stored_log(harness.writer, "s12", records, cwd="/srv/x")
        prepared = await harness.coordinator.prepare("s12")
        session = prepared.publish()
        session.append("turn/start", {"turn": 2})
        session.append("session/title", {"title": "again", "messageSeqs": [], "source": {"kind": "user"}})
        session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
        await harness.store.flush(session)
        stored = await harness.coordinator.read_events("s12")
        assert [event.seq for event in stored.events] == list(range(10))
        assert stored.events[6].type == "session/end-seed"
        assert encoded(stored.events[:6]) == [encode_record(record) for record in records]
        assert stored.header == prepared.observation.header
        assert stored.header.cwd == "/srv/x"
        assert stored.inherited_event_count == 0
        await prepared.close()

    async def test_resume_without_appends_adds_one_end_seed(self, harness: ConformanceHarness) -> None:
        """Preparing, publishing and disposing twice without appends grows the log by one end-seed."""
        await write_stored_log(harness.writer, "s13", closed_turn_records())
        for _ in range(2):
            prepared = await harness.coordinator.prepare("s13")
            session = prepared.publish()
            await harness.cold(session)
            await prepared.close()
        stored = await harness.coordinator.read_events("s13")
        assert len(stored.events) == 7
        assert stored.events[6].type == "session/end-seed"

    # ------------------------------------------------------------------ header facts

    async def test_fork_writes_seed_and_end_seed_in_first_batch(self, harness: ConformanceHarness) -> None:
        """A fork's first batch holds the 7 copied events + end-seed and stores seedLength 7."""
        parent = harness.store.create("p14")
        parent.append("request/context", {"provider": "scripted", "model": "test"})
        append_closed_turn(parent, 1)
        assert parent.seq == 7
        child = harness.store.fork(parent, child_id="c14")
        await harness.store.flush(child)
        first = next(record for record in harness.backend.appends if record.session_id == "c14")
        assert (first.first_seq, first.count, first.materialized) == (0, 8, False)
        await harness.cold(child)
        observation = await harness.coordinator.inspect("c14")
        assert observation.inherited_event_count == 7
        assert observation.header.is_seeded is True
        raw = await (await harness.raw()).load("c14")
        assert raw is not None
        assert raw.header["seedLength"] == 7

    async def test_unseeded_session_stores_no_cut(self, harness: ConformanceHarness) -> None:
        """An unseeded session stores no seedLength (or 0) and reads back with count 0."""
        session = harness.store.create("s15")
        append_closed_turn(session, 1)
        await harness.cold(session)
        raw = await (await harness.raw()).load("s15")
        assert raw is not None
        assert raw.header.get("seedLength", 0) == 0
        observation = await harness.coordinator.inspect("s15")
        assert observation.inherited_event_count == 0
        assert observation.header.is_seeded is False

    # ------------------------------------------------------------------ format verdicts

    @pytest.mark.parametrize(("version", "direction"), [(1, "newer"), (-1, "older")])
    async def test_foreign_version_is_format_unsupported(
        self, harness: ConformanceHarness, version: int, direction: str
    ) -> None:
        """A stored header version 1 / -1 is SESSION_FORMAT_UNSUPPORTED newer / older, never corrupt."""
        await write_stored_log(harness.writer, "s29", note_records(2), version=version)
        reads: list[Callable[[], Any]] = [
            lambda: harness.coordinator.inspect("s29"),
            lambda: harness.coordinator.read_events("s29"),
            lambda: harness.coordinator.prepare("s29"),
        ]
        for read in reads:
            with pytest.raises(SessionFormatUnsupportedError) as caught:
                await read()
            error = caught.value
            assert error.code == "SESSION_FORMAT_UNSUPPORTED"
            assert (error.found_version, error.direction, error.session_id) == (version, direction, "s29")

    async def test_unknown_type_refused_unless_ignorable(self, harness: ConformanceHarness) -> None:
        """A non-ignorable acme/x at seq 3 is format-unsupported; an ignorable one loads, preserved."""
        records = note_records(5)
        foreign = {"type": "acme/x", "seq": 3, "time": records[3]["time"], "data": {"v": [1, "two"]}}
        await write_stored_log(harness.writer, "s30", [*records[:3], foreign, records[4]])
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await harness.coordinator.inspect("s30")
        assert (caught.value.event_type, caught.value.seq) == ("acme/x", 3)
        tolerated = {**foreign, "ignorable": True}
        await write_stored_log(harness.writer, "t30", [*records[:3], tolerated, records[4]])
        observation = await harness.coordinator.inspect("t30")
        assert dict(observation.events[3]) == tolerated
        assert observation.events[3].ignorable is True

    async def test_legacy_vocabulary_is_format_unsupported(self, harness: ConformanceHarness) -> None:
        """A stored request/header-delta makes the log SESSION_FORMAT_UNSUPPORTED."""
        records = note_records(3)
        legacy = {"type": "request/header-delta", "seq": 1, "time": records[1]["time"], "data": {"delta": {}}}
        await write_stored_log(harness.writer, "s31", [records[0], legacy, records[2]])
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await harness.coordinator.inspect("s31")
        assert caught.value.code == "SESSION_FORMAT_UNSUPPORTED"

    async def test_seq_gap_foreign_id_and_oversized_cut_are_corruption(self, harness: ConformanceHarness) -> None:
        """A seq gap before a later turn/end, a foreign header id or a cut past the log is corrupt."""
        records = closed_turn_records()
        await write_stored_log(harness.writer, "gap32", [*records[:2], *records[3:]])
        await write_stored_log(harness.writer, "cut32", records, seedLength=len(records) + 1)
        damaged = ["gap32", "cut32"]
        try:
            await write_stored_log(harness.writer, "id32", records, header=stored_header("other32"))
        except ValueError:
            pass  # storage keyed by the header id (SQL) cannot hold a mismatch: nothing to read
        else:
            damaged.append("id32")
        for session_id in damaged:
            with pytest.raises(SessionCorruptionError) as caught:
                await harness.coordinator.inspect(session_id)
            assert caught.value.code == "SESSION_CORRUPT"

    async def test_typed_read_equals_filtered_full_read(self, harness: ConformanceHarness) -> None:
        """read_events(types, from_seq) equals the filtered full read; a foreign type still refuses."""

        def build(session: Session) -> None:
            append_closed_turn(session, 1)
            session.append("subagent/descriptor", {"version": 2, "mode": "continuable", "provider": "scripted"})
            append_closed_turn(session, 2)
            session.append("subagent/descriptor", {"version": 2, "mode": "one-shot", "provider": "scripted"})

        records = build_records(build)
        await write_stored_log(harness.writer, "s33", records)
        types = {"subagent/descriptor", "turn/end"}
        typed = await harness.coordinator.read_events("s33", types=types, from_seq=2)
        full = await harness.coordinator.read_events("s33")
        expected = [event for event in full.events if event.seq >= 2 and event.type in types]
        assert list(typed.events) == expected
        assert [event.seq for event in typed.events] == [5, 6, 12, 13]
        assert (typed.revision, typed.next_seq) == (full.revision, full.next_seq)
        assert typed.header == full.header
        foreign = {"type": "acme/x", "seq": 1, "time": records[1]["time"], "data": {}}
        await write_stored_log(harness.writer, "t33", [records[0], foreign])
        with pytest.raises(SessionFormatUnsupportedError):
            await harness.coordinator.read_events("t33", types=types, from_seq=0)

    async def test_unusual_values_round_trip_exactly(self, harness: ConformanceHarness) -> None:
        """An 8 MiB string, emoji, U+2028 and 2**53-1 round-trip exactly."""
        top = 2**53 - 1
        store = harness.new_store(clock=lambda: top)
        coordinator = await harness.open(store=store)
        session = store.create("s34")
        payload = {"big": "x" * (8 * 1024 * 1024), "emoji": "\U0001f642 ok", "separator": "a\u2028b", "top": top}
        session.append("session/title", {"title": payload, "messageSeqs": [top], "source": {"kind": "user"}})
        await harness.cold(session)
        observation = await coordinator.inspect("s34")
        assert observation.events[0].time == top
        assert observation.events[0].data == session.events[0].data
        assert encoded(observation.events) == encoded(session.events)

    async def test_new_backend_instance_sees_the_same_store(self, harness: ConformanceHarness) -> None:
        """A brand-new backend instance lists and inspects the same data and revisions."""
        for session_id in ("a35", "b35"):
            session = harness.store.create(session_id)
            append_closed_turn(session, 1)
            await harness.cold(session)
        before = await harness.coordinator.list()
        observed = await harness.coordinator.inspect("a35")
        coordinator = await harness.reopen()
        after = await coordinator.list()
        assert [(row.header, row.revision) for row in after] == [(row.header, row.revision) for row in before]
        again = await coordinator.inspect("a35")
        assert again.revision == observed.revision
        assert again.header == observed.header
        assert encoded(again.events) == encoded(observed.events)

    async def test_observations_are_deeply_immutable(self, harness: ConformanceHarness) -> None:
        """Mutating an observed event or its data raises TypeError; a later inspect is unaffected."""
        await write_stored_log(harness.writer, "s36", closed_turn_records())
        observation: PersistenceObservation = await harness.coordinator.inspect("s36")
        event: Any = observation.events[1]
        events: Any = observation.events
        with pytest.raises(TypeError):
            event["type"] = "changed"
        with pytest.raises(TypeError):
            event["data"]["id"] = "changed"
        with pytest.raises(TypeError):
            event["data"]["content"].append({"type": "text", "text": "more"})
        with pytest.raises(TypeError):
            events[0] = event
        again = await harness.coordinator.inspect("s36")
        assert encoded(again.events) == encoded(observation.events)
        data: Any = again.events[1].data
        assert data["id"] != "changed"
