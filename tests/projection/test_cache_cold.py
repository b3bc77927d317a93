"""`cold_snapshot`: anchored tail reads, one full-read fallback, write-back rules and aborts.

Reads are counted with a spy persistence: a cold fold reads exactly the tail from `restore_floor`
and falls back to exactly one full read; the write-back never targets a live id, keeps the stored
rows of unselected keys and replaces a mismatching identity. See
docs/projections.md#checkpoints-and-cold-restore.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from dsh.abort import AbortController, AbortError, AbortSignal
from dsh.persistence.errors import OperationCancelledError, SessionNotFoundError
from dsh.projection import ProjectionError
from dsh.projection.cache_storage import CacheIdentity
from dsh.session import Session, SessionId
from dsh.testing.stored_logs import BASE_TIME_MS
from tests.projection.helpers import CacheStack

LOGGER = "dsh.projection.cache"
ID = SessionId("c")


def _four_events(emit):
    """user, title, user, user: `counter` is 1 after seq 1 and 3 after seq 3; `hostonly` counts 4."""

    def build(session: Session) -> None:
        emit.user(session)
        emit.title(session, "t")
        emit.user(session)
        emit.user(session)

    return build


def _row(seq: int, n: int, ver: int = 1) -> dict:
    return {"ver": ver, "seq": seq, "val": {"n": n}}


async def test_a_record_at_seq_1_reads_only_the_anchored_tail(stack: CacheStack, counter, emit):
    """Persistence sees `read_events(id, from_seq=1)` only; the fold reaches seq 3 and the row advances."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(1, 1)})

    snapshot = await stack.cache.cold_snapshot(ID)

    assert stack.persistence.calls == [("read_events", ID, 1)]
    assert dict(snapshot.values) == {"counter": {"n": 3}}
    assert snapshot.as_of_seq == 3
    record = await stack.record(ID)
    assert record is not None
    assert record.rows == {"counter": _row(3, 3)}
    assert record.identity == CacheIdentity(BASE_TIME_MS, None, 0)


async def test_a_current_record_replays_nothing_new(stack: CacheStack, counter, emit):
    """A record already at the log end reads from one below it (the anchor) and folds no event."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(3, 3)})
    counter.applies = 0

    snapshot = await stack.cache.cold_snapshot(ID)

    assert stack.persistence.reads_of(ID) == [3]
    assert counter.applies == 0
    assert snapshot.get("counter") == {"n": 3}


async def test_a_version_mismatched_row_reads_once_from_zero(stack: CacheStack, counter, emit):
    """A row of another state version cannot seed the fold: exactly one read, from seq 0."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(1, 1, ver=2)})

    snapshot = await stack.cache.cold_snapshot(ID)

    assert stack.persistence.reads_of(ID) == [0]
    assert snapshot.get("counter") == {"n": 3}
    record = await stack.record(ID)
    assert record is not None
    assert record.rows["counter"] == _row(3, 3)


@pytest.mark.parametrize(
    ("row", "floor"),
    [(_row(9, 7), 9), ({"ver": 1, "seq": 1, "val": {"n": "one"}}, 1)],
    ids=["beyond-the-stored-end", "schema-invalid"],
)
async def test_an_unusable_row_costs_one_tail_read_then_one_full_read(
    stack: CacheStack, counter, emit, row: dict, floor: int
):
    """A row past the log end or failing `state_schema`: the anchored tail read, one full read, right value."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": row})

    snapshot = await stack.cache.cold_snapshot(ID)

    assert stack.persistence.reads_of(ID) == [floor, 0]
    assert snapshot.get("counter") == {"n": 3}
    assert snapshot.as_of_seq == 3
    record = await stack.record(ID)
    assert record is not None
    assert record.rows["counter"] == _row(3, 3)


async def test_a_failing_write_back_still_returns_the_snapshot(stack: CacheStack, counter, emit, caplog):
    """The write-back is fail-soft: the snapshot is returned and the exact warning is logged."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    stack.storage.fail_puts.append(OSError("disk full"))

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snapshot = await stack.cache.cold_snapshot(ID)

    assert snapshot.get("counter") == {"n": 3}
    assert (
        'session projection cache: cold-read write-back for "c" failed (cache stays stale): disk full'
        in caplog.messages
    )


async def test_an_absent_log_is_not_found(stack: CacheStack, counter):
    """No stored log: persistence's not-found error propagates unchanged, and nothing is written."""
    stack.register(counter)

    with pytest.raises(SessionNotFoundError) as caught:
        await stack.cache.cold_snapshot(ID)
    assert caught.value.code == "SESSION_NOT_FOUND"
    assert stack.storage.puts == 0


async def test_an_absent_log_is_not_found_with_zero_units(stack: CacheStack):
    """With no unit registered the existence probe still reports not-found."""
    with pytest.raises(SessionNotFoundError):
        await stack.cache.cold_snapshot(ID)
    assert stack.persistence.reads_of(ID) == [0]


async def test_zero_units_over_an_empty_log_is_minus_one(stack: CacheStack):
    """An empty stored log with no unit registered gives `(-1, {})`."""
    await stack.store_log(ID, lambda session: None)

    snapshot = await stack.cache.cold_snapshot(ID)

    assert snapshot.as_of_seq == -1
    assert dict(snapshot.values) == {}
    assert stack.storage.puts == 0


async def test_zero_units_over_a_log_is_its_last_seq(stack: CacheStack, counter, emit):
    """A present log with no selected unit registered gives its last seq and no values."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))

    snapshot = await stack.cache.cold_snapshot(ID, ["unregistered"])

    assert snapshot.as_of_seq == 3
    assert dict(snapshot.values) == {}
    assert stack.persistence.reads_of(ID) == [0]
    assert stack.storage.puts == 0


@pytest.mark.parametrize(
    "identity", [{"created_at": BASE_TIME_MS + 1}, {"cut": 2}, {"cwd": "/w"}], ids=["createdAt", "cut", "cwd"]
)
async def test_a_record_of_another_lifecycle_is_discarded_and_replaced(
    stack: CacheStack, counter, hostonly, emit, identity: dict
):
    """A record of another createdAt, cut or cwd is discarded; the write-back stores the log's identity."""
    stack.register(counter, hostonly)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(2, 50), "hostonly": _row(2, 50)}, **identity)

    snapshot = await stack.cache.cold_snapshot(ID, ["counter"])

    assert stack.persistence.reads_of(ID) == [2, 0]
    assert snapshot.get("counter") == {"n": 3}
    record = await stack.record(ID)
    assert record is not None
    assert record.identity == CacheIdentity(BASE_TIME_MS, None, 0)
    assert record.rows == {"counter": _row(3, 3)}  # the other lifecycle's hostonly row is not kept


async def test_a_mismatch_at_floor_zero_folds_the_tail_without_a_second_read(stack: CacheStack, counter, emit):
    """With floor 0 the tail already is the whole log: an identity mismatch costs no second read."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(0, 40)}, created_at=BASE_TIME_MS + 5)

    snapshot = await stack.cache.cold_snapshot(ID)

    assert stack.persistence.reads_of(ID) == [0]
    assert snapshot.get("counter") == {"n": 3}


async def test_a_live_id_is_never_written_back(stack: CacheStack, counter, emit):
    """When the id is live in this store the cold read writes nothing back."""
    stack.register(counter)
    live = stack.store.create("l")
    emit.user(live)
    await stack.store.flush(live)

    snapshot = await stack.cache.cold_snapshot(live.id)

    assert snapshot.get("counter") == {"n": 1}
    assert stack.storage.puts == 0


async def test_rows_of_unselected_registered_keys_are_kept(stack: CacheStack, counter, hostonly, emit):
    """`cold_snapshot(id, ["counter"])` refreshes counter and keeps the stored hostonly row as it was."""
    stack.register(counter, hostonly)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(1, 1), "hostonly": _row(1, 2), "gone": _row(1, 1)})
    hostonly.applies = 0

    await stack.cache.cold_snapshot(ID, ["counter"])

    record = await stack.record(ID)
    assert record is not None
    assert record.rows == {"counter": _row(3, 3), "hostonly": _row(1, 2)}  # rows of unregistered keys dropped
    assert hostonly.applies == 0


async def test_a_unit_failure_propagates_without_a_reread(stack: CacheStack, bomb, emit):
    """`PROJECTION_UNIT_FAILED` propagates after one read: re-reading cannot cure a unit."""
    stack.register(bomb)
    await stack.store_log(ID, lambda session: (emit.user(session), emit.boom(session)))

    with pytest.raises(ProjectionError) as caught:
        await stack.cache.cold_snapshot(ID)
    assert caught.value.code == "PROJECTION_UNIT_FAILED"
    assert stack.persistence.reads_of(ID) == [0]
    assert stack.storage.puts == 0


async def test_a_storage_read_failure_is_a_logged_miss(stack: CacheStack, counter, emit, caplog):
    """A failing record read is logged and treated as no record: one full read, then a write-back."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": _row(1, 1)})
    stack.storage.fail_gets.append(OSError("locked"))

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snapshot = await stack.cache.cold_snapshot(ID)

    assert snapshot.get("counter") == {"n": 3}
    assert stack.persistence.reads_of(ID) == [0]
    assert 'session projection cache: read for "c" failed (treated as a miss): locked' in caplog.messages
    assert stack.storage.puts == 1


async def test_an_aborted_signal_reads_nothing(stack: CacheStack, counter, emit):
    """A signal aborted before the call raises `AbortError` before any read."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))

    with pytest.raises(AbortError):
        await stack.cache.cold_snapshot(ID, signal=AbortSignal.aborted_with())
    assert stack.persistence.calls == []
    assert stack.storage.gets == 0


async def test_an_abort_during_the_tail_read_stops_before_the_full_read(stack: CacheStack, counter, emit):
    """Aborted during the anchored read: raised right after it, no full read, no write-back."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    await stack.put_rows(ID, {"counter": {"ver": 1, "seq": 1, "val": {"n": "bad"}}})
    controller = AbortController()
    stack.persistence.after_read = lambda seq: controller.abort()

    with pytest.raises(AbortError):
        await stack.cache.cold_snapshot(ID, signal=controller.signal)
    assert stack.persistence.reads_of(ID) == [1]
    assert stack.storage.puts == 0


async def test_an_exception_reason_is_raised_itself(stack: CacheStack, counter, emit):
    """When the abort reason is an exception, that exception is raised."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    controller = AbortController()
    reason = TimeoutError("listing deadline")
    stack.persistence.after_read = lambda seq: controller.abort(reason)

    with pytest.raises(TimeoutError) as caught:
        await stack.cache.cold_snapshot(ID, signal=controller.signal)
    assert caught.value is reason


async def test_a_persistence_cancellation_surfaces_as_the_signal_abort(stack: CacheStack, counter, emit):
    """A read that fails because the signal aborted raises through `throw_if_aborted`."""
    stack.register(counter)
    await stack.store_log(ID, _four_events(emit))
    controller = AbortController()

    def cancelled(seq: int) -> None:
        controller.abort()
        raise OperationCancelledError("the persistence operation was cancelled by its signal")

    stack.persistence.after_read = cancelled

    with pytest.raises(AbortError):
        await stack.cache.cold_snapshot(ID, signal=controller.signal)


async def test_no_write_back_while_a_write_of_the_id_is_in_flight(stack: CacheStack, counter, emit):
    """A cold read never replaces a policy write in flight for the id (its live cut covers at least as much)."""
    stack.register(counter)
    session = stack.store.create(ID)
    emit.user(session)
    emit.user(session)
    stack.storage.hold_puts()
    stack.store.dispose(session)
    await stack.storage.wait_held(1)

    snapshot = await asyncio.wait_for(stack.cache.cold_snapshot(ID), 10)
    stack.storage.release_all()
    await stack.settle()

    assert snapshot.get("counter") == {"n": 2}
    assert stack.storage.puts == 1
    assert stack.cache._recent_cuts == {}


async def test_no_write_back_when_a_write_was_cut_during_the_read(stack: CacheStack, counter, emit):
    """A write cut while the cold read was in flight wins: the read's write-back is skipped."""
    stack.register(counter)
    session = stack.store.create(ID)
    emit.user(session)
    await stack.store.flush(session)
    gate = stack.persistence.read_gate = asyncio.Event()

    reading = asyncio.create_task(stack.cache.cold_snapshot(ID))
    await asyncio.wait_for(stack.persistence.reading.wait(), 10)
    stack.store.dispose(session)  # the disposal cut is taken now, after the read started
    await stack.settle()
    assert stack.storage.puts == 1
    gate.set()
    snapshot = await reading

    assert snapshot.get("counter") == {"n": 1}
    assert stack.storage.puts == 1
    assert stack.cache._recent_cuts == {}
    assert stack.cache._slots == {}
