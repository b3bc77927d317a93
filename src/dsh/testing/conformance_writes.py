"""Write-path conformance tests: appends, faults, the batching window, flush barriers, close,
identity vetoes, the prepared cache and cancellation.

Layer: testing (shipped, importable). `WriteConformance` is a base of `PersistenceConformance`
(`dsh.testing.persistence`), which provides the `harness` fixture these tests use; on its own it
collects nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from dsh.abort import AbortSignal
from dsh.json import FrozenDict, freeze
from dsh.persistence.errors import (
    AppendConflictError,
    OperationCancelledError,
    PersistenceClosedError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    SessionPersistenceError,
)
from dsh.session.events import make_event
from dsh.session.header import SessionHeader
from dsh.testing.conformance_harness import (
    ConformanceHarness,
    closed_turn_records,
    encoded,
    eventually,
    note_records,
)
from dsh.testing.stored_logs import (
    BASE_TIME_MS,
    append_closed_turn,
    append_note,
    write_stored_log,
)

__all__ = ["WriteConformance"]

_BACKGROUND_FAILURE = "failed (buffered events retained)"


class WriteConformance:
    """The write-path half of the suite (a base of `PersistenceConformance`; collects nothing on its own)."""

    __test__: ClassVar[bool] = False

    # ------------------------------------------------------------------ appends and faults

    async def test_append_must_start_at_stored_next_seq(self, harness: ConformanceHarness) -> None:
        """append_batch starting at 4 or 6 over a stored next seq of 5 raises APPEND_SEQ_MISMATCH."""
        header = await write_stored_log(harness.writer, "s16", note_records(5))
        stored = SessionHeader.from_stored(header)[0].to_stored(0)
        backend = await harness.raw()
        fence = await backend.acquire("s16")
        before = await backend.read_revision("s16")
        try:
            for seq in (4, 6):
                data = FrozenDict({"title": "late", "messageSeqs": freeze([]), "source": FrozenDict({"kind": "user"})})
                event = make_event("session/title", seq, BASE_TIME_MS, data)
                with pytest.raises(AppendConflictError) as caught:
                    await backend.append_batch(stored, [event], materialized=True, fence=fence)
                assert caught.value.code == "APPEND_SEQ_MISMATCH"
            assert await backend.read_revision("s16") == before
        finally:
            await backend.release("s16")

    async def test_failed_batch_is_invisible_and_retried_once(self, harness: ConformanceHarness) -> None:
        """A fault in the middle of a batch leaves none of it visible; the retry stores it once."""
        session = harness.store.create("s17")
        append_closed_turn(session, 1)
        await harness.store.flush(session)
        append_closed_turn(session, 2)
        if harness.backend.has_io_faults:
            harness.backend.fail_next_append(partial=True)
        else:
            harness.backend.fail_next_append()
        with pytest.raises(SessionPersistenceError):
            await harness.store.flush(session)
        visible = await harness.coordinator.read_events("s17")
        assert [event.seq for event in visible.events] == list(range(6))
        await harness.store.flush(session)
        stored = await harness.coordinator.read_events("s17")
        assert [event.seq for event in stored.events] == list(range(12))
        assert encoded(stored.events) == encoded(session.events)

    async def test_fixed_window_batches_by_the_manual_timer(self, harness: ConformanceHarness) -> None:
        """20 events 10 ms apart become one batch at t=200; an event at t=250 is written at t=450."""
        timer, backend = harness.timer, harness.backend
        session = harness.store.create("s18")
        for index in range(20):
            timer.advance_to(index * 10)
            append_note(session, index)
        timer.advance_to(199)
        assert backend.calls["append_batch"] == 0
        timer.advance_to(200)
        await backend.wait_appends(1)
        assert [(a.at, a.first_seq, a.count) for a in backend.appends] == [(200, 0, 20)]
        timer.advance_to(250)
        append_note(session, 20)
        timer.advance_to(449)
        assert backend.calls["append_batch"] == 1
        timer.advance_to(450)
        await backend.wait_appends(2)
        assert [(a.at, a.first_seq, a.count) for a in backend.appends[1:]] == [(450, 20, 1)]

    async def test_concurrent_flushes_share_one_barrier(self, harness: ConformanceHarness) -> None:
        """Two concurrent flushes write at once, return after durability, and include later events."""
        timer, backend, store = harness.timer, harness.backend, harness.store
        session = store.create("s19")
        append_note(session, 0)
        timer.advance_to(50)
        append_note(session, 1)
        backend.hold_calls("append_batch")
        first = asyncio.ensure_future(store.flush(session))
        second = asyncio.ensure_future(store.flush(session))
        await backend.wait_calls("append_batch", 1)
        assert timer.now_ms == 50
        append_note(session, 2)
        assert not first.done()
        assert not second.done()
        backend.release_calls("append_batch")
        await asyncio.gather(first, second)
        assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 2), (2, 1)]
        assert timer.pending == 0

    async def test_background_failure_retains_and_logs_once(
        self, harness: ConformanceHarness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A failed background write keeps events, logs one record, never retries by itself."""
        caplog.set_level(logging.ERROR)
        timer, backend = harness.timer, harness.backend
        session = harness.store.create("s20")
        for index in range(3):
            append_note(session, index)
        backend.fail_next_append()

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if _BACKGROUND_FAILURE in r.getMessage() and '"s20"' in r.getMessage()]

        timer.advance_to(200)
        await eventually(lambda: len(failures()) == 1)
        assert "background write for session" in failures()[0].getMessage()
        timer.advance_to(10_000)
        assert backend.calls["append_batch"] == 1
        assert timer.pending == 0
        append_note(session, 3)
        timer.advance(200)
        await backend.wait_appends(1)
        assert [(a.first_seq, a.count) for a in backend.appends] == [(0, 4)]
        assert len(failures()) == 1
        stored = await harness.coordinator.read_events("s20")
        assert [event.seq for event in stored.events] == [0, 1, 2, 3]

    async def test_permanent_failure_raises_then_recovers(self, harness: ConformanceHarness) -> None:
        """With a backend failing permanently flush raises; after recovery it stores with no gap."""
        session = harness.store.create("s21")
        append_closed_turn(session, 1)
        harness.backend.fail_always("append_batch")
        for _ in range(2):
            with pytest.raises(PersistenceIOError):
                await harness.store.flush(session)
        append_closed_turn(session, 2)
        harness.backend.clear()
        await harness.store.flush(session)
        stored = await harness.coordinator.read_events("s21")
        assert [event.seq for event in stored.events] == list(range(12))

    async def test_close_drains_disposed_sessions(self, harness: ConformanceHarness) -> None:
        """Events of a session disposed without flush survive close and reopen."""
        session = harness.store.create("s22")
        append_closed_turn(session, 1)
        harness.store.dispose(session)
        coordinator = await harness.reopen()
        observation = await coordinator.inspect("s22")
        assert encoded(observation.events) == encoded(session.events)

    async def test_closed_coordinator_refuses_everything(self, harness: ConformanceHarness) -> None:
        """After close every call raises PERSISTENCE_CLOSED, publication too; a second close is a no-op."""
        await write_stored_log(harness.writer, "s23", closed_turn_records())
        coordinator = harness.coordinator
        await coordinator.close()
        calls: list[Callable[[], Any]] = [
            coordinator.list,
            lambda: coordinator.inspect("s23"),
            lambda: coordinator.prepare("s23"),
            lambda: coordinator.read_events("s23"),
            lambda: coordinator.revision("s23"),
        ]
        for call in calls:
            with pytest.raises(PersistenceClosedError) as caught:
                await call()
            assert caught.value.code == "PERSISTENCE_CLOSED"
        with pytest.raises(PersistenceClosedError):
            harness.store.create("fresh23")
        assert harness.store.get("fresh23") is None
        await coordinator.close()

    async def test_fresh_session_never_adopts_a_stored_id(self, harness: ConformanceHarness) -> None:
        """Flushing a fresh session whose id is stored raises SESSION_ALREADY_EXISTS, every time."""
        await write_stored_log(harness.writer, "s24", closed_turn_records())
        before = await harness.writer.snapshot("s24")
        session = harness.store.create("s24")
        append_closed_turn(session, 1)
        for _ in range(2):
            with pytest.raises(SessionAlreadyExistsError) as caught:
                await harness.store.flush(session)
            assert caught.value.code == "SESSION_ALREADY_EXISTS"
        assert await harness.writer.snapshot("s24") == before

    async def test_reserved_id_vetoes_a_fresh_publication(self, harness: ConformanceHarness) -> None:
        """While "x" is prepared, publishing another fresh "x" raises SESSION_ALREADY_EXISTS."""
        await write_stored_log(harness.writer, "s25", closed_turn_records())
        async with await harness.coordinator.prepare("s25"):
            with pytest.raises(SessionAlreadyExistsError):
                harness.store.create("s25")
            assert harness.store.get("s25") is None

    async def test_prepared_cache_reuses_and_evicts(self, harness: ConformanceHarness) -> None:
        """inspect + prepare cost one load; an external append reloads; the LRU evicts least recent."""
        for session_id in ("a26", "b26", "c26"):
            await write_stored_log(harness.writer, session_id, note_records(3))
        coordinator, backend = harness.coordinator, harness.backend
        await coordinator.inspect("a26")
        async with await coordinator.prepare("a26"):
            assert backend.reads == 1
        await harness.writer.append("a26", note_records(4)[3:])
        observation = await coordinator.inspect("a26")
        assert backend.reads == 2
        assert len(observation.events) == 4
        small = await harness.reopen(prepared_cache_size=2)
        backend = harness.backend
        await small.inspect("a26")
        await small.inspect("b26")
        await small.inspect("a26")
        await small.inspect("c26")
        assert backend.reads == 3
        await small.inspect("a26")
        assert backend.reads == 3
        await small.inspect("b26")
        assert backend.reads == 4

    async def test_cancelled_waiter_never_cancels_the_shared_load(self, harness: ConformanceHarness) -> None:
        """Of two concurrent inspects one is cancelled: a single load runs and the other gets it."""
        await write_stored_log(harness.writer, "s27", note_records(3))
        backend = harness.backend
        backend.hold_calls("load")
        first = asyncio.ensure_future(harness.coordinator.inspect("s27"))
        second = asyncio.ensure_future(harness.coordinator.inspect("s27"))
        await backend.wait_calls("load", 1)
        first.cancel()
        backend.release_calls("load")
        observation = await second
        assert len(observation.events) == 3
        assert first.cancelled()
        assert backend.calls["load"] == 1

    async def test_pre_aborted_signal_reaches_no_backend(self, harness: ConformanceHarness) -> None:
        """A pre-aborted signal raises OPERATION_CANCELLED with its reason and calls no backend."""
        await write_stored_log(harness.writer, "s28", note_records(2))
        backend = harness.backend
        before = sum(backend.calls.values())
        reason = "user pressed stop"
        signal = AbortSignal.aborted_with(reason)
        calls: list[Callable[[], Any]] = [
            lambda: harness.coordinator.list(signal=signal),
            lambda: harness.coordinator.inspect("s28", signal=signal),
            lambda: harness.coordinator.read_events("s28", signal=signal),
            lambda: harness.coordinator.prepare("s28", signal=signal),
        ]
        for call in calls:
            with pytest.raises(OperationCancelledError) as caught:
                await call()
            assert caught.value.code == "OPERATION_CANCELLED"
            assert caught.value.reason == reason
        assert sum(backend.calls.values()) == before
