"""`cached_snapshot` and the cache identity.

A record names a lifecycle, not a slot: it is served only for the exact `createdAt`, `cwd` and
inherited cut it was written under, with zero log reads and exactly one storage read. See
docs/projections.md#checkpoints-and-cold-restore and docs/glossary.md#identity.
"""

from __future__ import annotations

import pytest

from dsh.errors import ConfigError
from dsh.projection import ProjectionError
from dsh.projection.cache import ProjectionCacheConfig
from dsh.session import HeaderInit, SessionHeader, SessionId, SessionLogOffset
from tests.projection.helpers import CacheStack

ROWS = {
    "counter": {"ver": 1, "seq": 5, "val": {"n": 2}},
    "hostonly": {"ver": 1, "seq": 7, "val": {"n": 8}},
    "nullish": {"ver": 1, "seq": 3, "val": {}},
}


def _header(session_id: str = "c1", *, created_at: int = 1, cwd: str | None = "/w", seeded: bool = False):
    return SessionHeader(version=0, id=SessionId(session_id), created_at=created_at, cwd=cwd, is_seeded=seeded)


async def test_cached_snapshot_serves_the_record_with_zero_log_reads(stack: CacheStack, counter, hostonly, nullish):
    """A matching record serves views, min served seq, no host-only rows, one storage read, no persistence."""
    stack.register(counter, hostonly, nullish)
    await stack.put_rows("c1", ROWS, created_at=1, cwd="/w", cut=0)

    snapshot = await stack.cache.cached_snapshot(_header(), SessionLogOffset(0), ["counter"])

    assert snapshot is not None
    assert dict(snapshot.values) == {"counter": {"n": 2}}
    assert snapshot.as_of_seq == 5
    assert stack.storage.gets == 1
    assert stack.persistence.calls == []
    assert stack.persistence.total_reads == 0


async def test_all_keys_take_the_minimum_seq_and_never_show_host_only_rows(
    stack: CacheStack, counter, hostonly, nullish
):
    """Without keys every client-visible row is served, `null` included, at the minimum served seq."""
    stack.register(counter, hostonly, nullish)
    await stack.put_rows("c1", ROWS, created_at=1, cwd="/w", cut=0)

    snapshot = await stack.cache.cached_snapshot(_header(), SessionLogOffset(0))

    assert snapshot is not None
    assert dict(snapshot.values) == {"counter": {"n": 2}, "nullish": None}
    assert snapshot.as_of_seq == 3
    assert "hostonly" not in snapshot.values
    assert stack.persistence.calls == []


@pytest.mark.parametrize(
    ("header", "cut"),
    [
        (_header("unknown"), 0),
        (_header(created_at=2), 0),
        (_header(cwd="/x"), 0),
        (_header(cwd=None), 0),
        (_header(seeded=True), 4),
    ],
    ids=["unknown-id", "createdAt-2", "cwd-x", "cwd-absent", "cut-4"],
)
async def test_an_identity_mismatch_is_a_miss(stack: CacheStack, counter, header: SessionHeader, cut: int):
    """Another id, createdAt, cwd (absent included) or cut is never served."""
    stack.register(counter)
    await stack.put_rows("c1", ROWS, created_at=1, cwd="/w", cut=0)

    assert await stack.cache.cached_snapshot(header, SessionLogOffset(cut), ["counter"]) is None
    assert stack.persistence.calls == []


async def test_absent_cwd_matches_only_absent_cwd(stack: CacheStack, counter):
    """A record written without cwd is served for a header without cwd only."""
    stack.register(counter)
    await stack.put_rows("c1", ROWS, created_at=1, cwd=None, cut=0)

    assert await stack.cache.cached_snapshot(_header(cwd=None), SessionLogOffset(0)) is not None
    assert await stack.cache.cached_snapshot(_header(cwd="/w"), SessionLogOffset(0)) is None


async def test_a_seeded_record_is_served_only_for_its_exact_cut(stack: CacheStack, counter):
    """A record bound to cut 4 is served for cut 4 and missed for cut 3."""
    stack.register(counter)
    await stack.put_rows("c1", ROWS, created_at=1, cwd="/w", cut=4)

    assert await stack.cache.cached_snapshot(_header(seeded=True), SessionLogOffset(4)) is not None
    assert await stack.cache.cached_snapshot(_header(seeded=True), SessionLogOffset(3)) is None


async def test_every_row_version_mismatched_is_a_miss(stack: CacheStack, counter, nullish):
    """When no row matches its unit's version there is nothing to serve: None."""
    stack.register(counter, nullish)
    await stack.put_rows(
        "c1",
        {"counter": {"ver": 9, "seq": 5, "val": {"n": 2}}, "nullish": {"ver": 0, "seq": 3, "val": {}}},
        created_at=1,
        cwd="/w",
    )

    assert await stack.cache.cached_snapshot(_header(), SessionLogOffset(0)) is None


async def test_only_unregistered_or_host_only_keys_is_a_miss(stack: CacheStack, counter, hostonly):
    """No served key (host-only or unknown selection) gives None, not an empty snapshot."""
    stack.register(counter, hostonly)
    await stack.put_rows("c1", ROWS, created_at=1, cwd="/w")

    assert await stack.cache.cached_snapshot(_header(), SessionLogOffset(0), ["hostonly", "nope"]) is None


@pytest.mark.parametrize(("seeded", "cut"), [(False, 4), (True, 0), (False, -1), (False, True)])
async def test_a_cut_contradicting_is_seeded_is_a_value_error(stack: CacheStack, counter, seeded: bool, cut: object):
    """The cut must agree with `is_seeded` (an unseeded header with cut 4 is refused) before any read."""
    stack.register(counter)

    with pytest.raises(ValueError, match="inconsistent"):
        await stack.cache.cached_snapshot(_header(seeded=seeded), cut)  # type: ignore[arg-type]
    assert stack.storage.gets == 0


async def test_cached_snapshot_storage_failure_is_storage_failed(stack: CacheStack, counter):
    """A storage read failure surfaces as `PROJECTION_CACHE_STORAGE_FAILED`."""
    stack.register(counter)
    stack.storage.fail_gets.append(OSError("disk gone"))

    with pytest.raises(ProjectionError) as caught:
        await stack.cache.cached_snapshot(_header(), SessionLogOffset(0))
    assert caught.value.code == "PROJECTION_CACHE_STORAGE_FAILED"
    assert "disk gone" in caught.value.message


async def test_a_record_of_one_lifecycle_is_never_served_for_another(stack: CacheStack, counter, emit):
    """A row written for one lifecycle misses for a deleted-and-recreated id, another cwd and another fork cut."""
    stack.register(counter)
    first = stack.store.create("x", header=HeaderInit(cwd="/w"))
    emit.user(first)
    await stack.cache.write(first)
    assert await stack.cache.cached_snapshot(first.header, SessionLogOffset(0)) is not None

    # Delete and recreate the id: a new lifecycle (new createdAt) under the same slot.
    stack.store.dispose(first)
    await stack.settle()
    del stack.memory.sessions["x"]
    second = stack.store.create("x", header=HeaderInit(cwd="/w"))
    assert second.header.created_at != first.header.created_at
    assert await stack.cache.cached_snapshot(second.header, SessionLogOffset(0)) is None

    # Same createdAt but another cwd is another lifecycle too.
    moved = SessionHeader(version=0, id=first.id, created_at=first.header.created_at, cwd="/elsewhere")
    assert await stack.cache.cached_snapshot(moved, SessionLogOffset(0)) is None


async def test_a_fork_record_is_bound_to_its_exact_cut(stack: CacheStack, counter, emit):
    """A forked child's record carries its inherited cut and is missed for any other cut."""
    stack.register(counter)
    parent = stack.store.create("p")
    emit.user(parent)
    emit.user(parent)
    child = stack.store.fork(parent, child_id="k")
    emit.user(child)
    await stack.cache.write(child)

    record = await stack.record("k")
    assert record is not None
    assert record.identity.inherited_event_count == child.inherited_event_count > 0
    served = await stack.cache.cached_snapshot(child.header, SessionLogOffset(child.inherited_event_count))
    assert served is not None
    assert served.get("counter") == {"n": 3}
    other = SessionLogOffset(child.inherited_event_count - 1)
    assert await stack.cache.cached_snapshot(child.header, other) is None


@pytest.mark.parametrize(
    "values",
    [
        {"write_every_events": 0},
        {"write_every_events": True},
        {"write_interval_ms": 0},
        {"write_interval_ms": 1.5},
        {"close_timeout_s": 0},
        {"close_timeout_s": "1"},
    ],
)
def test_invalid_config_is_config_invalid(values: dict[str, object]):
    """Invalid policy values raise `ConfigError` (`CONFIG_INVALID`)."""
    with pytest.raises(ConfigError) as caught:
        ProjectionCacheConfig(**values)  # type: ignore[arg-type]
    assert caught.value.code == "CONFIG_INVALID"
