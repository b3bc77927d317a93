"""The write policy: count, interval and idle triggers, disposal, fail-soft writes, `aclose`.

The cache stack uses count throttle 3, interval 250 ms and idle 400 ms on a `ManualTimer`, so time
moves only when a test advances it; the idle tests use `IDLE_POLICY` (idle 100 ms, count 100,
interval 10 s). A flush or a `turn/end` writes nothing by itself. See
docs/projections.md#cache-write-policy.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from dsh.projection import ProjectionRegistry
from dsh.projection.cache import ProjectionCache, ProjectionCacheConfig
from dsh.projection.cache_storage import MemoryCacheStorage
from dsh.session import Session, SessionStore
from dsh.testing.timer import ManualTimer
from tests.projection.helpers import IDLE_POLICY, POLICY, CacheStack, SpyStorage

LOGGER = "dsh.projection.cache"


def _failed(trigger: str, session_id: str, error: str) -> str:
    return f'session projection cache: {trigger} write for "{session_id}" failed (cache stays stale): {error}'


async def _seq_of(stack: CacheStack, session_id: str, key: str = "counter") -> int | None:
    record = await stack.record(session_id)
    return None if record is None else record.rows[key]["seq"]


@pytest.mark.parametrize("policy", [IDLE_POLICY])
async def test_a_turn_end_and_its_flush_write_nothing_until_the_session_is_idle(stack: CacheStack, counter, emit):
    """`turn/end` and the flush after it write nothing; the first idle check with no newer event writes once.

    The idle timer is armed by `turn/start` at 0 ms; at 100 ms it sees the events of 50 ms and waits
    again; at 200 ms nothing came since, so the session is idle and its turn-final value is written.
    """
    stack.register(counter)
    session = stack.store.create("s")
    emit.turn_start(session)
    stack.timer.advance_to(50)
    emit.user(session)
    end = emit.turn_end(session)
    await stack.store.flush(session)
    await stack.settle()
    assert stack.storage.puts == 0

    stack.timer.advance_to(199)
    await stack.settle()
    assert stack.storage.puts == 0
    stack.timer.advance_to(200)
    await stack.settle()

    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == end.seq
    assert stack.timer.pending == 0


@pytest.mark.parametrize("policy", [IDLE_POLICY])
async def test_events_keep_a_session_from_going_idle(stack: CacheStack, counter, emit):
    """Each time the idle timer fires after newer events it waits again; the write follows the last event."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    for at in (50, 150, 250):
        stack.timer.advance_to(at)
        emit.user(session)
    last = session.events[-1]
    stack.timer.advance_to(399)
    await stack.settle()
    assert stack.storage.puts == 0

    stack.timer.advance_to(400)
    await stack.settle()

    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == last.seq


@pytest.mark.parametrize(
    "policy", [ProjectionCacheConfig(write_every_events=10, write_interval_ms=10_000, idle_ms=10_000)]
)
async def test_turns_flushed_one_by_one_are_checkpointed_by_count_not_per_flush(stack: CacheStack, counter, emit):
    """Six turns of four events, each flushed: the 24 events give two count writes, not six."""
    stack.register(counter)
    session = stack.store.create("s")
    for turn in range(1, 7):
        emit.turn_start(session, turn)
        emit.user(session)
        emit.user(session)
        emit.turn_end(session, turn)
        await stack.store.flush(session)
        await stack.settle()

    assert stack.storage.puts == 2
    assert await _seq_of(stack, "s") == session.seq - 1  # the second cut was taken at the last flush


async def test_the_count_throttle_writes_at_the_third_event(stack: CacheStack, counter, emit):
    """With count 3 two events write nothing and the third writes once (its armed timer is cancelled)."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    emit.user(session)
    await stack.settle()
    assert stack.storage.puts == 0

    third = emit.user(session)
    await stack.settle()

    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == third.seq
    assert stack.timer.pending == 0


async def test_the_interval_fires_at_250_ms_not_249(stack: CacheStack, counter, emit):
    """One dirty event arms the timer: no write at 249 ms, one write at 250 ms."""
    stack.register(counter)
    session = stack.store.create("s")
    event = emit.user(session)

    stack.timer.advance_to(249)
    await stack.settle()
    assert stack.storage.puts == 0

    stack.timer.advance_to(250)
    await stack.settle()
    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == event.seq


async def test_later_events_do_not_move_the_deadline(stack: CacheStack, counter, emit):
    """An event at 100 ms neither re-arms nor delays the timer armed at 0 ms."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    stack.timer.advance_to(100)
    second = emit.user(session)
    assert stack.timer.next_due() == 250

    stack.timer.advance_to(249)
    await stack.settle()
    assert stack.storage.puts == 0
    stack.timer.advance_to(250)
    await stack.settle()

    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == second.seq


async def test_the_first_dirty_event_after_a_clean_write_arms_a_fresh_timer(stack: CacheStack, counter, emit):
    """After an interval write the next event arms a new window from its own time."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    stack.timer.advance_to(250)
    await stack.settle()
    stack.timer.advance_to(400)

    emit.user(session)

    assert stack.timer.next_due() == 650


async def test_turn_end_counts_like_any_event_and_a_write_resets_the_counter(stack: CacheStack, counter, emit):
    """`turn/end` is one more dirty event: the third event writes, and the count restarts from zero."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    emit.user(session)
    end = emit.turn_end(session)
    await stack.settle()
    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == end.seq

    emit.user(session)
    emit.user(session)
    await stack.settle()
    assert stack.storage.puts == 1
    emit.user(session)
    await stack.settle()
    assert stack.storage.puts == 2


async def test_a_burst_of_events_queues_one_count_write(stack: CacheStack, counter, emit):
    """Events that arrive while a policy write waits for its cut are covered by it: one write."""
    stack.register(counter)
    session = stack.store.create("s")
    for _ in range(10):
        emit.user(session)
    await stack.settle()

    assert stack.storage.puts == 1
    assert await _seq_of(stack, "s") == session.seq - 1
    assert stack.timer.pending == 0


async def test_disposal_writes_once_and_cancels_the_armed_timer(stack: CacheStack, counter, emit):
    """`disposed` is a mandatory write; the dirty state and its two timers go with it."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    assert stack.timer.pending == 2

    stack.store.dispose(session)
    await stack.settle()
    stack.timer.advance(10_000)
    await stack.settle()

    assert stack.timer.pending == 0
    assert stack.storage.puts == 1
    assert stack.cache._dirty == {}


async def test_a_failed_count_write_is_logged_and_healed(stack: CacheStack, counter, emit, caplog):
    """A failing put logs the exact warning naming `count` and the id; the next count write heals."""
    stack.register(counter)
    session = stack.store.create("s")
    stack.storage.fail_puts.append(OSError("disk full"))
    emit.turn_start(session)
    emit.user(session)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        emit.turn_end(session)
        await stack.settle()

    assert _failed("count", "s", "projection cache storage failed: disk full") in caplog.messages
    assert await stack.record("s") is None

    emit.turn_start(session, 2)
    emit.user(session)
    end = emit.turn_end(session, 2)
    await stack.settle()
    record = await stack.record("s")
    assert record is not None
    assert record.rows["counter"] == {"ver": 1, "seq": end.seq, "val": {"n": 2}}


@pytest.mark.parametrize(
    ("trigger", "act", "policy"),
    [
        ("count", lambda stack, emit, s: [emit.user(s) for _ in range(3)], POLICY),
        ("interval", lambda stack, emit, s: (emit.user(s), stack.timer.advance(250)), POLICY),
        ("idle", lambda stack, emit, s: (emit.user(s), stack.timer.advance(100)), IDLE_POLICY),
        ("dispose", lambda stack, emit, s: stack.store.dispose(s), POLICY),
    ],
)
async def test_every_trigger_logs_its_failure(stack: CacheStack, counter, emit, caplog, trigger: str, act):
    """Count, interval, idle and dispose writes are fail-soft and log the exact text with their trigger."""
    stack.register(counter)
    session = stack.store.create("s")
    stack.storage.fail_puts.append(OSError("boom"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        act(stack, emit, session)
        await stack.settle()

    assert _failed(trigger, "s", "projection cache storage failed: boom") in caplog.messages


async def test_a_failed_flush_is_logged_and_the_next_write_heals(stack: CacheStack, counter, emit, caplog):
    """A write whose durability step fails logs and stores nothing; the next count write lands."""
    stack.register(counter)
    session = stack.store.create("s")
    failures = [OSError("fsync failed")]

    async def flaky_flush(flushed: Session) -> None:
        if failures:
            raise failures.pop()

    stack.store.on_flush(flaky_flush)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            emit.user(session)
        await stack.settle()
    assert _failed("count", "s", "fsync failed") in caplog.messages
    assert await stack.record("s") is None

    emit.user(session)
    emit.user(session)
    third = emit.user(session)
    await stack.settle()
    assert await _seq_of(stack, "s") == third.seq


async def test_an_armed_timer_writes_nothing_after_aclose(stack: CacheStack, counter, emit):
    """`aclose` cancels the armed timers: advancing past them afterwards writes nothing."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    assert stack.timer.pending == 2

    await stack.cache.aclose()
    stack.timer.advance(1_000)
    emit.user(session)
    emit.turn_end(session)
    await asyncio.sleep(0)

    assert stack.timer.pending == 0
    assert stack.storage.puts == 0
    assert stack.cache._tasks == set()


async def test_aclose_waits_for_an_in_flight_write(stack: CacheStack, counter, emit):
    """A write already running when `aclose` starts still lands before the storage closes."""
    stack.register(counter)
    session = stack.store.create("s")
    stack.storage.hold_puts()
    landed: list[int] = []
    stack.storage.on_put = lambda sid, record: landed.append(record.rows["counter"]["seq"])
    emit.user(session)
    emit.user(session)
    end = emit.turn_end(session)
    await stack.storage.wait_held(1)

    closing = asyncio.create_task(stack.cache.aclose())
    await asyncio.sleep(0)
    assert not closing.done()
    stack.storage.release_all()
    await closing

    assert landed == [end.seq]
    assert stack.storage.puts == 1


async def test_aclose_abandons_writes_past_the_timeout(
    store: SessionStore, registry: ProjectionRegistry, counter, emit, caplog
):
    """Writes unfinished at `close_timeout_s` are cancelled with a warning; no task is left running."""
    storage = SpyStorage(MemoryCacheStorage(), [])
    config = ProjectionCacheConfig(write_every_events=3, write_interval_ms=250, close_timeout_s=0.01)
    cache = await ProjectionCache.open(
        storage,
        registry=registry,
        sessions=store,
        persistence=None,
        config=config,
        timer=ManualTimer(),  # type: ignore[arg-type]
    )

    async def slow_flush(flushed: Session) -> None:
        await asyncio.Event().wait()  # never confirms durability

    store.on_flush(slow_flush)
    registry.register(counter.unit)
    session = store.create("s")
    for _ in range(3):
        emit.user(session)
    await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await cache.aclose()

    assert "session projection cache: abandoning 1 unfinished write(s) at close" in caplog.messages
    assert cache._tasks == set()
    assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("dsh-cache-")]
    assert storage.puts == 0
    store.close()


async def test_aclose_is_idempotent_and_closes_the_storage(stack: CacheStack, counter):
    """A second `aclose` returns quietly; the storage is closed and refuses later calls."""
    stack.register(counter)
    await asyncio.gather(stack.cache.aclose(), stack.cache.aclose())
    await stack.cache.aclose()

    assert stack.cache.closed
    with pytest.raises(Exception, match="closed"):
        await stack.storage.inner.get("s")  # type: ignore[arg-type]


async def test_a_cancelled_aclose_still_stops_writes_and_closes_storage(stack: CacheStack, counter, emit):
    """Cancelling `aclose` mid-wait cancels the writes and still closes the storage: no task is left."""
    stack.register(counter)
    session = stack.store.create("s")
    stack.storage.hold_puts()
    for _ in range(3):
        emit.user(session)
    await stack.storage.wait_held(1)

    closing = asyncio.create_task(stack.cache.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing

    assert stack.cache._tasks == set()
    with pytest.raises(Exception, match="closed"):
        await stack.storage.inner.get("s")  # type: ignore[arg-type]


async def test_disposal_after_aclose_writes_nothing(stack: CacheStack, counter, emit):
    """Sessions disposed after the cache closed trigger no write (the close order prevents it)."""
    stack.register(counter)
    session = stack.store.create("s")
    emit.user(session)
    await stack.cache.aclose()

    stack.store.dispose(session)
    await asyncio.sleep(0)

    assert stack.storage.puts == 0


async def test_a_vetoed_publication_writes_nothing(stack: CacheStack, counter, emit):
    """A publication vetoed by persistence emits `disposed`, but the never-live session is not written."""
    stack.register(counter)
    await stack.store_log("v", emit.user)
    await stack.coordinator.inspect("v")  # the id is now in persistence's prepared cache: it owns the identity
    await stack.put_rows("v", {"counter": {"ver": 1, "seq": 0, "val": {"n": 1}}})

    with pytest.raises(Exception, match="persisted state already owns this identity"):
        stack.store.create("v")
    await stack.settle()

    assert stack.storage.puts == 0
    record = await stack.record("v")
    assert record is not None
    assert record.rows["counter"]["val"] == {"n": 1}


def test_appends_and_disposal_outside_a_loop_log_instead_of_leaking_coroutines(counter, emit, caplog):
    """Policy triggers with no running loop log the exact warning and leave no coroutine unawaited."""
    store = SessionStore()
    registry = ProjectionRegistry(store)
    registry.register(counter.unit)
    cache = ProjectionCache(
        MemoryCacheStorage(),
        registry=registry,
        sessions=store,
        persistence=None,  # type: ignore[arg-type]
        config=ProjectionCacheConfig(write_every_events=1),
        timer=ManualTimer(),
    )
    session = store.create("s")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        emit.turn_end(session)
        emit.user(session)
        store.dispose(session)

    assert caplog.messages == [
        _failed("count", "s", "no running event loop"),
        _failed("count", "s", "no running event loop"),
        _failed("dispose", "s", "no running event loop"),
    ]
    assert cache._tasks == set()
    assert cache._slots == {}
    registry.close()


def test_the_default_timer_outside_a_loop_logs_instead_of_raising(counter, emit, caplog):
    """A dirty event with no running loop cannot arm the default timer: one exact warning, the append is unaffected."""
    store = SessionStore()
    registry = ProjectionRegistry(store)
    registry.register(counter.unit)
    cache = ProjectionCache(
        MemoryCacheStorage(),
        registry=registry,
        sessions=store,
        persistence=None,  # type: ignore[arg-type]
        config=ProjectionCacheConfig(),
        timer=None,
    )
    session = store.create("s")
    with caplog.at_level(logging.WARNING):
        emit.user(session)

    assert caplog.messages == [_failed("interval", "s", "no running event loop")]
    assert session.seq == 1
    assert cache._tasks == set()
    registry.close()
