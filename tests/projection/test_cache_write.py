"""`ProjectionCache.write`: ordering, durability, the lossless check and per-id serialization.

Steps: serialize per id, take the cut, make the log durable (flush while live, persistence drain
after disposal), check lossless JSON, put the whole record. See docs/projections.md#cache-write-policy.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from dsh.projection import ClientView, ProjectionError, ProjectionUnit
from dsh.projection.cache import ProjectionCache
from dsh.projection.cache_storage import CacheRecord, MemoryCacheStorage
from dsh.session import HeaderInit, Session, SessionError, SessionLogOffset
from tests.projection.helpers import POLICY, CacheStack, until

NOT_JSON = "projection checkpoint is not losslessly JSON-serializable (a unit state violates the plain-JSON contract)"


async def test_a_never_dirtied_session_writes_the_init_state_at_seq_minus_one(stack: CacheStack, counter, hostonly):
    """An empty session's record holds `init()` at seq -1 and its identity carries the exact cut."""
    stack.register(counter, hostonly)
    session = stack.store.create("s", header=HeaderInit(cwd="/w"))

    await stack.cache.write(session)

    record = await stack.record("s")
    assert record is not None
    assert record.rows == {
        "counter": {"ver": 1, "seq": -1, "val": {"n": 0}},
        "hostonly": {"ver": 1, "seq": -1, "val": {"n": 0}},
    }
    assert record.identity.created_at == session.header.created_at
    assert record.identity.cwd == "/w"
    assert record.identity.inherited_event_count == session.inherited_event_count == 0


async def test_a_forked_session_records_its_inherited_cut(stack: CacheStack, counter, emit):
    """The identity of a fork's record includes `s.inherited_event_count`."""
    stack.register(counter)
    parent = stack.store.create("p")
    emit.user(parent)
    child = stack.store.fork(parent, child_id="c")

    await stack.cache.write(child)

    record = await stack.record("c")
    assert record is not None
    assert record.identity.inherited_event_count == child.inherited_event_count == 1
    assert record.rows["counter"]["seq"] == child.seq - 1


async def test_the_log_is_flushed_before_the_record_lands(stack: CacheStack, counter, emit):
    """A spy flush listener sees flush-start, flush-end, then the put; the log is durable at put time."""
    stack.register(counter)
    session = stack.store.create("s")

    async def spy_flush(flushed: Session) -> None:
        stack.order.append("flush-start")
        await asyncio.sleep(0)
        stack.order.append("flush-end")

    stack.store.on_flush(spy_flush)
    emit.user(session)
    emit.user(session)
    stored_at_put: list[int] = []
    stack.storage.on_put = lambda sid, record: stored_at_put.append(len(stack.memory.sessions[sid].lines))

    await stack.cache.write(session)

    assert stack.order == ["flush-start", "flush-end", "put"]
    assert stored_at_put == [session.seq]


async def test_a_failing_flush_fails_the_write_and_nothing_lands(stack: CacheStack, counter, emit):
    """When durability cannot be confirmed `write` raises the flush error and stores nothing."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)

    async def failing_flush(flushed: Session) -> None:
        raise OSError("fsync failed")

    stack.store.on_flush(failing_flush)

    with pytest.raises(OSError, match="fsync failed"):
        await stack.cache.write(session)
    assert await stack.record("s") is None
    assert stack.storage.puts == 0


async def test_a_store_without_persistence_cannot_confirm_durability(store, registry, counter, emit):
    """With no flush participant the write fails (`PROJECTION_CACHE_STORAGE_FAILED`)."""
    storage = MemoryCacheStorage()
    cache = await ProjectionCache.open(
        storage,
        registry=registry,
        sessions=store,
        persistence=None,
        config=POLICY,  # type: ignore[arg-type]
    )
    try:
        registry.register(counter.unit)
        session = store.create("s")
        emit.user(session)
        with pytest.raises(ProjectionError) as caught:
            await cache.write(session)
        assert caught.value.code == "PROJECTION_CACHE_STORAGE_FAILED"
        assert await storage.get(session.id) is None
    finally:
        store.close()
        await cache.aclose()


async def test_an_unpublished_session_is_refused(stack: CacheStack, counter):
    """A prepared (never published) session cannot prove durability: `SESSION_NOT_LIVE`."""
    stack.register(counter)
    prepared = stack.store.prepare("u")

    with pytest.raises(SessionError) as caught:
        await stack.cache.write(prepared)
    assert caught.value.code == "SESSION_NOT_LIVE"
    assert await stack.record("u") is None


async def test_a_nan_state_fails_the_lossless_json_check(stack: CacheStack, kit):
    """A unit state holding NaN fails the lossless check with the exact message; nothing lands."""
    nan_unit = ProjectionUnit(
        key="nan",
        state_version=1,
        init=lambda: {"x": float("nan")},
        apply=lambda state, event: state,
        state_schema=kit.object_schema,
    )
    stack.register(nan_unit)
    session = stack.store.create("s")

    with pytest.raises(ProjectionError) as caught:
        await stack.cache.write(session)
    assert caught.value.code == "PROJECTION_CACHE_NOT_JSON"
    assert caught.value.message == NOT_JSON
    assert await stack.record("s") is None


async def test_disposal_writes_the_final_value_after_the_drain(stack: CacheStack, counter, emit):
    """Disposal writes the final value, after persistence's drain made every event durable."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    emit.user(session)
    stored_at_put: list[int] = []
    stack.storage.on_put = lambda sid, record: stored_at_put.append(len(stack.memory.sessions[sid].lines))

    stack.store.dispose(session)
    await stack.settle()

    assert stack.order == ["drain-start", "drain-end", "put"]
    assert stored_at_put == [session.seq]
    record = await stack.record("s")
    assert record is not None
    assert record.rows["counter"] == {"ver": 1, "seq": session.seq - 1, "val": {"n": 2}}


async def test_the_disposal_cut_is_taken_in_the_listener_before_any_await(stack: CacheStack, counter, emit):
    """The cut is taken synchronously: unregistering the unit right after dispose does not lose its row."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)

    stack.store.dispose(session)
    for dispose in stack.disposers:  # synchronously, before the disposal task ever runs
        dispose()
    stack.disposers.clear()
    await stack.settle()

    record = await stack.record("s")
    assert record is not None
    assert record.rows == {"counter": {"ver": 1, "seq": session.seq - 1, "val": {"n": 1}}}


async def test_writes_of_one_id_never_overlap(stack: CacheStack, counter, emit):
    """Three writes of one id run one at a time, in order, each with a fresher cut."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    stack.storage.hold_puts()
    landed: list[int] = []
    stack.storage.on_put = lambda sid, record: landed.append(record.rows["counter"]["val"]["n"])

    first = asyncio.create_task(stack.cache.write(session))
    await stack.storage.wait_held(1)
    emit.user(session)
    second = asyncio.create_task(stack.cache.write(session))
    await until(lambda: stack.cache._slots[session.id].users == 2)
    stack.storage.release_one()
    await first
    # The first write released the id's lock but the second has not run yet: a third write must
    # queue behind the second, never start beside it.
    emit.user(session)
    third = asyncio.create_task(stack.cache.write(session))
    await until(lambda: stack.storage.in_flight >= 2 or stack.cache._slots[session.id].users >= 2)
    stack.storage.release_all()
    await asyncio.gather(second, third)

    assert stack.storage.max_in_flight == 1
    assert landed == [1, 2, 3]
    assert session.id not in stack.cache._slots


async def test_rows_of_unregistered_keys_are_dropped_at_the_next_write(stack: CacheStack, counter, emit):
    """A record's rows of keys no longer registered disappear when the record is rewritten."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    await stack.put_rows(
        "s",
        {"gone": {"ver": 1, "seq": 0, "val": {}}, "counter": {"ver": 7, "seq": 0, "val": {"n": 99}}},
        created_at=session.header.created_at,
    )

    await stack.cache.write(session)

    record = await stack.record("s")
    assert record is not None
    assert record.rows == {"counter": {"ver": 1, "seq": 0, "val": {"n": 1}}}


async def test_a_failed_unit_is_omitted_from_the_record(stack: CacheStack, counter, bomb, emit, caplog):
    """A unit disabled for the session has no row; the other units are written normally."""
    stack.register(bomb, counter)
    session = stack.store.create("s")
    with caplog.at_level(logging.CRITICAL, logger="dsh.projection.registry"):
        emit.boom(session)
    emit.user(session)

    await stack.cache.write(session)

    record = await stack.record("s")
    assert record is not None
    assert set(record.rows) == {"counter"}


async def test_a_storage_put_failure_is_storage_failed(stack: CacheStack, counter):
    """A failing put raises `PROJECTION_CACHE_STORAGE_FAILED` naming the cause."""
    stack.register(counter)
    session = stack.store.create("s")
    stack.storage.fail_puts.append(OSError("disk full"))

    with pytest.raises(ProjectionError) as caught:
        await stack.cache.write(session)
    assert caught.value.code == "PROJECTION_CACHE_STORAGE_FAILED"
    assert "disk full" in caught.value.message


async def test_a_state_holding_1e16_round_trips_as_a_float(stack: CacheStack, kit):
    """`1e16` survives write and read as a float on every storage, also through `cached_snapshot`."""
    big = ProjectionUnit(
        key="big",
        state_version=1,
        init=lambda: {"x": 1e16, "n": 10**15},
        apply=lambda state, event: state,
        state_schema=kit.object_schema,
        view=ClientView(render=lambda state: state, schema=kit.object_schema),
    )
    stack.register(big)
    session = stack.store.create("s")
    await stack.cache.write(session)

    record = await stack.record("s")
    assert isinstance(record, CacheRecord)
    value = record.rows["big"]["val"]["x"]
    assert type(value) is float
    assert value == 1e16
    assert type(record.rows["big"]["val"]["n"]) is int
    served = await stack.cache.cached_snapshot(session.header, SessionLogOffset(0))
    assert served is not None
    assert type(served.values["big"]["x"]) is float  # type: ignore[index]
