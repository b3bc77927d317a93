"""Live and cached identity: live children read from the registry, unseeded cold children from the cache.

A live child's identity is its `subagent` snapshot, kept only when it comes from the child's own suffix
(docs/catalog.md#live-identity). An unseeded cold child asks the projection cache first; any miss or
fault falls through silently to one observation (docs/catalog.md#cached-identity).
"""

from __future__ import annotations

from typing import Any

from dsh.projection.unit import ProjectionSnapshot, ProjectionUnit
from dsh.session.header import SessionLogOffset
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow
from tests.subagent.helpers import (
    Stack,
    child_events,
    desc,
    descriptor,
    fork_events,
    identity_row,
    turn_end,
    turn_start,
    user_message,
)
from tests.subagent.spies import CacheDouble, SnapshotSpy, SpyQuery


def running(child_id: str, label: str) -> SubagentChildRow:
    """The row of a live continuable child."""
    return SubagentChildRow(child_id, "continuable", "running", False, label=label)  # type: ignore[arg-type]


def inactive(child_id: str, label: str) -> SubagentChildRow:
    """The row of a cold continuable child."""
    return SubagentChildRow(child_id, "continuable", "inactive", False, label=label)  # type: ignore[arg-type]


def corrupt(child_id: str) -> SubagentDiagnosticRow:
    """A `corrupt` diagnostic row."""
    return SubagentDiagnosticRow(child_id, "corrupt")  # type: ignore[arg-type]


def snapshot_of(value: Any, as_of: int = 3) -> ProjectionSnapshot:
    """A cache answer carrying `value` under the `subagent` key."""
    return ProjectionSnapshot(as_of_seq=as_of, values={"subagent": value})


# ------------------------------------------------------------------------------------------ live identity


async def test_live_child_reads_only_the_subagent_key(stack: Stack, spy_query: SpyQuery) -> None:
    """A live child: `snapshot(session, keys=("subagent",))`, zero observations and zero log reads."""
    spy = SnapshotSpy(stack.registry)
    try:
        stack.live_child("live", session_id="c1")
        assert await stack.list_children() == [running("c1", "live")]
    finally:
        spy.remove()
    assert spy.calls == [("c1", ("subagent",))]
    assert spy_query.observations == 0
    assert stack.persistence.total_reads == 0


async def test_live_child_in_its_creation_window_is_omitted(stack: Stack) -> None:
    """A live origin child with only `turn/start` is omitted."""
    stack.live_child(None)
    assert await stack.list_children() == []


async def test_live_child_with_a_malformed_later_descriptor_is_omitted(stack: Stack) -> None:
    """A live child whose second descriptor is malformed folds to null: running + null is omitted."""
    child = stack.live_child("was valid")
    child.append("subagent/descriptor", {"version": 2, "mode": "continuable", "provider": 7, "label": "x"})
    assert await stack.list_children() == []


async def test_live_fork_with_only_an_ancestor_descriptor_is_omitted(stack: Stack, spy_query: SpyQuery) -> None:
    """A live fork whose seed replays an ancestor descriptor, own not yet appended: `is_own_seq` rejects it."""
    child = stack.live_fork_child("fork", own=None)
    assert child.inherited_event_count == 4
    assert stack.registry.snapshot(child, ("subagent",)).get("subagent") == {
        "mode": "continuable",
        "label": "ancestor label",
        "seq": 2,
    }
    assert await stack.list_children() == []
    assert spy_query.observations == 0


async def test_live_fork_with_its_own_descriptor_at_the_cut_is_listed(stack: Stack) -> None:
    """The own descriptor staged at seq == cut is accepted (equality boundary)."""
    child = stack.live_fork_child("fork", own=desc("own label"))
    assert child.events[4].type == "subagent/descriptor"
    assert child.is_own_seq(4)
    assert await stack.list_children() == [running("fork", "own label")]


async def test_live_seeded_child_costs_no_observation(stack: Stack, spy_query: SpyQuery) -> None:
    """A live seeded child is served from the live store: zero observations, zero log reads."""
    stack.live_fork_child("fork", own=desc("seeded live"))
    assert await stack.list_children() == [running("fork", "seeded live")]
    assert spy_query.observations == 0
    assert stack.persistence.total_reads == 0


async def test_foreign_hostile_unit_is_isolated_by_key_selection(
    stack: Stack, spy_query: SpyQuery, foreign_hostile_unit: ProjectionUnit[Any, Any]
) -> None:
    """With a foreign unit whose view always raises, a live and a cold child list normally."""
    stack.live_child("live one", session_id="live")
    await stack.author_child("cold", events=child_events(desc("cold one")))
    assert await stack.list_children() == [inactive("cold", "cold one"), running("live", "live one")]
    assert spy_query.observed == {"cold": 1}


async def test_live_child_whose_subagent_view_raises_is_corrupt_not_omitted(
    stack: Stack, hostile_subagent_unit: None
) -> None:
    """A live child whose `subagent` view raises is `corrupt` (never omitted); its sibling runs normally."""
    stack.live_child("poison me", session_id="a-poisoned", created_at=1)
    stack.live_child("live healthy", session_id="b-healthy", created_at=2)
    assert await stack.list_children() == [corrupt("a-poisoned"), running("b-healthy", "live healthy")]


# ------------------------------------------------------------------------------------------ cached identity


async def test_cache_hit_serves_the_cached_identity(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """An unseeded cold child with a cache row `cached own`: served from the cache, nothing observed."""
    await cache_stack.author_child("c1", events=child_events(desc("disk label")))
    await cache_stack.cache_put("c1", {"subagent": identity_row("cached own", 2)})
    assert await cache_stack.list_children() == [inactive("c1", "cached own")]
    assert spy_query.observations == 0
    assert cache_stack.persistence.total_reads == 0


async def test_cache_is_asked_with_cut_zero_and_the_subagent_key(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """A cache hit was asked as `(header, SessionLogOffset(0), ("subagent",))`."""
    header = await cache_stack.author_child("c1", events=child_events(desc("disk label")))
    await cache_stack.cache_put("c1", {"subagent": identity_row("cached own", 2)})
    assert cache_stack.cache is not None
    double = CacheDouble(cache_stack.cache)
    cache_stack.services.projection_cache = double  # type: ignore[assignment]
    assert await cache_stack.list_children() == [inactive("c1", "cached own")]
    assert double.calls == [(header, SessionLogOffset(0), ("subagent",))]
    assert spy_query.observations == 0


async def test_cached_identity_has_no_seq_gate_for_unseeded_children(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """A cached identity with seq 0 on an unseeded child is served (no seq gate)."""
    spawn_layout = [descriptor(0, desc("seq zero")), turn_start(1), user_message(2), turn_end(3)]
    await cache_stack.author_child("c1", events=spawn_layout)
    await cache_stack.cache_put("c1", {"subagent": identity_row("seq zero", 0)})
    assert await cache_stack.list_children() == [inactive("c1", "seq zero")]
    assert spy_query.observations == 0


async def test_seeded_child_never_consults_the_cache(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """A seeded cold child with a valid own identity cached: never asked of the cache, observed once."""
    await cache_stack.author_child("fork", events=fork_events(desc("own label")), cut=4)
    await cache_stack.cache_put("fork", {"subagent": identity_row("own label", 4, as_of=8)}, cut=4)
    assert cache_stack.cache is not None
    double = CacheDouble(cache_stack.cache)
    cache_stack.services.projection_cache = double  # type: ignore[assignment]
    assert await cache_stack.list_children() == [inactive("fork", "own label")]
    assert double.calls == []
    assert spy_query.observed == {"fork": 1}


async def test_cache_misses_observe_once_per_listing(stack: Stack, spy_query: SpyQuery) -> None:
    """A cache answering None, then `{as_of_seq: 0, values: {}}`: one observation per listing, real label."""
    await stack.author_child("c1", events=child_events(desc("real label")))
    double = CacheDouble(steps=[None, ProjectionSnapshot(as_of_seq=0, values={})])
    stack.services.projection_cache = double  # type: ignore[assignment]
    assert await stack.list_children() == [inactive("c1", "real label")]
    assert await stack.list_children() == [inactive("c1", "real label")]
    assert spy_query.observed == {"c1": 2}
    assert double.ids() == ["c1", "c1"]


async def test_cached_null_falls_through(stack: Stack, spy_query: SpyQuery) -> None:
    """A cache serving `subagent: null` falls through to one observation and the real label."""
    await stack.author_child("c1", events=child_events(desc("real label")))
    stack.services.projection_cache = CacheDouble(steps=[snapshot_of(None)])  # type: ignore[assignment]
    assert await stack.list_children() == [inactive("c1", "real label")]
    assert spy_query.observed == {"c1": 1}


async def test_cache_read_failure_falls_through(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """A cache whose storage read raises: the real row via one observation, no diagnostic."""
    await cache_stack.author_child("c1", events=child_events(desc("real label")))
    await cache_stack.cache_put("c1", {"subagent": identity_row("cached", 2)})
    assert cache_stack.cache_storage is not None
    cache_stack.cache_storage.get_failure = OSError("disk on fire")
    assert await cache_stack.list_children() == [inactive("c1", "real label")]
    assert spy_query.observed == {"c1": 1}


async def test_raising_cached_snapshot_falls_through(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """`cached_snapshot` raising (as for a poisoned row) and a real poisoned row both fall through silently."""
    await cache_stack.author_child("a", events=child_events(desc("label a")))
    await cache_stack.author_child("b", header={"createdAt": 2}, events=child_events(desc("label b")))
    assert cache_stack.cache_storage is not None
    # A real poisoned row: valid JSON rows whose `subagent` state breaks the unit's schema.
    poisoned = {"subagent": {"ver": 2, "seq": 3, "val": {"identity": {"mode": "bogus", "seq": "x"}}}}
    await cache_stack.cache_put("b", poisoned, created_at=2)
    assert cache_stack.cache is not None
    double = CacheDouble(cache_stack.cache, steps=[ValueError("poisoned checkpoint row")])
    cache_stack.services.projection_cache = double  # type: ignore[assignment]
    assert await cache_stack.list_children() == [inactive("a", "label a"), inactive("b", "label b")]
    assert spy_query.observed == {"a": 1, "b": 1}


async def test_cache_record_of_another_lifecycle_is_a_miss(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """A cache record for the id from another lifecycle (other createdAt): None, and one observation."""
    header = await cache_stack.author_child("c1", events=child_events(desc("real label")))
    await cache_stack.cache_put("c1", {"subagent": identity_row("old life", 2)}, created_at=999)
    assert cache_stack.cache is not None
    assert await cache_stack.cache.cached_snapshot(header, SessionLogOffset(0), ("subagent",)) is None
    assert await cache_stack.list_children() == [inactive("c1", "real label")]
    assert spy_query.observed == {"c1": 1}


async def test_cache_record_with_another_cut_is_a_miss(cache_stack: Stack) -> None:
    """A cache record whose identity cut is 4 gives None for `cached_snapshot(header, 0, keys)`."""
    header = await cache_stack.author_child("c1", events=child_events(desc("real label")))
    await cache_stack.cache_put("c1", {"subagent": identity_row("cut four", 2)}, cut=4)
    assert cache_stack.cache is not None
    assert await cache_stack.cache.cached_snapshot(header, SessionLogOffset(0), ("subagent",)) is None


async def test_stale_cached_label_is_served_for_unseeded_children_only(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """A stale cached first label is served for an unseeded child; a seeded one is observed and shows the last.

    An accepted deviation (docs/catalog.md#accepted-deviations): it needs a second descriptor and a missed
    checkpoint, and seeded children never consult the cache.
    """
    events = [*child_events(desc("first")), descriptor(4, desc("second"))]
    await cache_stack.author_child("plain", events=events)
    await cache_stack.cache_put("plain", {"subagent": identity_row("first", 2)})
    seeded = [*fork_events(desc("first")), descriptor(9, desc("second"))]
    await cache_stack.author_child("seeded", header={"createdAt": 2}, events=seeded, cut=4)
    await cache_stack.cache_put("seeded", {"subagent": identity_row("first", 4, as_of=8)}, created_at=2, cut=4)
    assert await cache_stack.list_children() == [inactive("plain", "first"), inactive("seeded", "second")]
    assert spy_query.observed == {"seeded": 1}


async def test_listing_writes_nothing(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """After listings served by every kind of identity, the cache saw no write and no log revision changed."""
    stack = cache_stack
    live = stack.live_child("live", session_id="live")
    await stack.store.flush(live)
    await stack.author_child("hit", events=child_events(desc("hit")))
    await stack.cache_put("hit", {"subagent": identity_row("hit", 2)})
    await stack.author_child("miss", events=child_events(desc("miss")))
    await stack.author_child("fork", events=fork_events(desc("fork")), cut=4)
    await stack.author_child("broken", events=child_events({"version": 2}))
    ids = ["live", "hit", "miss", "fork", "broken"]
    revisions = {i: await stack.persistence.revision(i) for i in ids}
    assert all(revision is not None for revision in revisions.values())
    assert stack.cache_storage is not None
    puts_before = sum(stack.cache_storage.puts.values())
    hashes = await stack.file_hashes()
    for _ in range(2):
        rows = await stack.list_children()
        assert len(rows) == 5
    assert sum(stack.cache_storage.puts.values()) == puts_before
    assert stack.cache_storage.deletes == 0
    assert {i: await stack.persistence.revision(i) for i in ids} == revisions
    assert await stack.file_hashes() == hashes
    assert spy_query.observed == {"miss": 2, "fork": 2, "broken": 2}
