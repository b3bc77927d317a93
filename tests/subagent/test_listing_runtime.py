"""`SubagentRuntime` as the catalog's host: call-time services, lazy unit registration, provenance report.

Services are read at call time, the units are registered idempotently in whichever registry is mounted
when a listing runs (all or nothing), and the runtime keeps no state between calls.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsh.projection import ClientView, ProjectionError, ProjectionRegistry, ProjectionUnit
from dsh.services import Services
from dsh.subagent.listing import ListingReport
from dsh.subagent.rows import SubagentChildRow
from dsh.subagent.runtime import SubagentRuntime
from tests.subagent.helpers import (
    PassthroughSchema,
    Stack,
    child_events,
    desc,
    fork_events,
    identity_row,
)
from tests.subagent.spies import SpyQuery


async def test_registry_mounted_later_is_served_at_call_time(stack: Stack, spy_query: SpyQuery) -> None:
    """A registry mounted after the runtime was built gets the units at the next listing."""
    fresh = ProjectionRegistry(stack.store)
    try:
        stack.services.projections = fresh
        assert "subagent" not in tuple(fresh.keys())
        stack.live_child("served by the new registry", session_id="c1")
        rows = await stack.list_children()
        assert rows == [SubagentChildRow("c1", "continuable", "running", False, label="served by the new registry")]  # type: ignore[arg-type]
        assert {"subagent", "subagentTiming"} <= set(fresh.keys())
        await stack.list_children()  # idempotent: a second listing registers nothing twice
        assert fresh.keys().count("subagent") == 1
    finally:
        stack.runtime.release_units()
        assert "subagent" not in tuple(fresh.keys())
        fresh.close()
    assert spy_query.observations == 0


async def test_unit_registration_is_all_or_nothing(stack: Stack) -> None:
    """A registry that refuses the timing unit (version conflict) keeps no `subagent` registration from the runtime."""
    registry = ProjectionRegistry(stack.store)
    squatter: ProjectionUnit[Any, Any] = ProjectionUnit(
        key="subagentTiming",
        state_version=1,
        init=dict,
        apply=lambda state, _event: state,
        state_schema=PassthroughSchema(),
        view=ClientView(render=dict, schema=PassthroughSchema()),
    )
    dispose = registry.register(squatter)
    try:
        with pytest.raises(ProjectionError) as caught:
            SubagentRuntime(Services(projections=registry))
        assert caught.value.code == "PROJECTION_VERSION_CONFLICT"
        assert registry.keys() == ("subagentTiming",)
    finally:
        dispose()
        registry.close()


async def test_report_names_the_rung_of_every_row(cache_stack: Stack, spy_query: SpyQuery) -> None:
    """The per-call report names each row's rung (live, cached or observed identity) and counts the observations."""
    stack = cache_stack
    stack.live_child("live", session_id="a-live", created_at=1)
    await stack.author_child("b-cached", header={"createdAt": 2}, events=child_events(desc("cached")))
    await stack.cache_put("b-cached", {"subagent": identity_row("cached", 2)}, created_at=2)
    await stack.author_child("c-fork", header={"createdAt": 3}, events=fork_events(desc("fork")), cut=4)
    await stack.author_child("d-broken", header={"createdAt": 4}, events=child_events({"version": 2}))
    reports: list[ListingReport] = []
    rows = await stack.list_children(report=reports.append)
    assert [row.id for row in rows] == ["a-live", "b-cached", "c-fork", "d-broken"]
    (report,) = reports
    assert report.rungs == {"a-live": 1, "b-cached": 2, "c-fork": 3}
    assert report.observations == spy_query.observations == 2
    descendants: list[ListingReport] = []
    await stack.list_descendants(report=descendants.append)
    assert descendants[0].rungs == report.rungs  # a new report per call: nothing carried over
