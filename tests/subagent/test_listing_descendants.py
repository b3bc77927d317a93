"""`list_descendants`: an iterative pre-order walk over the paired corpus (docs/catalog.md#descendants)."""

from __future__ import annotations

import sys

import pytest

from dsh.abort import AbortSignal
from dsh.session import HeaderInit
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentDiagnosticRow
from tests.subagent.helpers import (
    Stack,
    child_events,
    desc,
    one_shot_desc,
    stillborn_events,
    turn_end,
    turn_start,
    user_message,
)
from tests.subagent.spies import SpyQuery


def child(child_id: str, label: str, *, has_children: bool = False, activity: str = "inactive") -> SubagentChildRow:
    """A continuable child row."""
    return SubagentChildRow(child_id, "continuable", activity, has_children, label=label)  # type: ignore[arg-type]


def at(entry: SubagentChildRow | SubagentDiagnosticRow, parent_id: str, depth: int) -> SubagentDescendantEntry:
    """A descendant entry."""
    return SubagentDescendantEntry(entry, parent_id, depth)  # type: ignore[arg-type]


def corrupt(child_id: str) -> SubagentDiagnosticRow:
    """A `corrupt` diagnostic row."""
    return SubagentDiagnosticRow(child_id, "corrupt")  # type: ignore[arg-type]


async def test_descendants_come_in_pre_order_with_parent_and_depth(stack: Stack) -> None:
    """A (t1, parent), G (t2, under A), B (t3, parent): [A(parent,1,hasChildren), G(A,2), B(parent,1)]."""
    await stack.author_child("A", header={"createdAt": 1}, events=child_events(desc("a")))
    await stack.author_child("G", header={"createdAt": 2, "parentSession": "A", "delegationDepth": 2})
    await stack.author_child("B", header={"createdAt": 3}, events=child_events(desc("b")))
    rows = await stack.list_descendants()
    assert rows == [
        at(child("A", "a", has_children=True), "parent", 1),
        at(child("G", "G"), "A", 2),
        at(child("B", "b"), "parent", 1),
    ]
    assert rows[1].to_json() == {
        "kind": "child",
        "id": "G",
        "mode": "continuable",
        "label": "G",
        "activity": "inactive",
        "hasChildren": False,
        "parentId": "A",
        "depth": 2,
    }


async def test_root_without_descendants_lists_nothing(stack: Stack) -> None:
    """A root with no descendants gives []."""
    await stack.author_child("elsewhere", header={"parentSession": "someone-else"})
    assert await stack.list_descendants() == []


async def test_creation_window_node_is_omitted_but_walked(stack: Stack) -> None:
    """A live origin child in its creation window with an authored child: only the lower child, depth 2."""
    stack.live_child(None, session_id="window")
    await stack.author_child("lower", header={"parentSession": "window", "delegationDepth": 2})
    assert await stack.list_descendants() == [at(child("lower", "lower"), "window", 2)]


async def test_cycle_through_an_ordinary_root_stops_at_the_root(stack: Stack) -> None:
    """Root R (parent N, no origin) and N (parent R, origin): from R only N (parent R, depth 1)."""
    await stack.author_child(
        "R", header={"parentSession": "N", "origin": None}, events=[turn_start(0), user_message(1), turn_end(2)]
    )
    await stack.author_child("N", header={"parentSession": "R"}, events=child_events(desc("n")))
    assert await stack.list_descendants("R") == [at(child("N", "n"), "R", 1)]


@pytest.mark.slow
async def test_ten_thousand_deep_chain_is_walked_without_recursion(stack: Stack) -> None:
    """9,999 nested ordinary live sessions and a live subagent leaf: one running row at depth 10,000."""
    parent = "parent"
    for index in range(9_999):
        session_id = f"n{index:05d}"
        stack.store.create(session_id, header=HeaderInit(parent_session=parent, created_at=index))
        parent = session_id
    stack.live_child("deep leaf", session_id="leaf", parent=parent)
    limit = sys.getrecursionlimit()
    assert limit < 10_000
    rows = await stack.list_descendants()
    assert rows == [at(child("leaf", "deep leaf", activity="running"), parent, 10_000)]


async def test_walk_crosses_ordinary_forks_and_one_shot_children(stack: Stack) -> None:
    """An ordinary fork's child sits at depth 2 under the fork; a one-shot precedes its own child."""
    fork = stack.store.fork(stack.parent, child_id="fork")
    await stack.author_child("under-fork", header={"parentSession": fork.id, "createdAt": 5})
    await stack.author_child("one-shot", header={"createdAt": 1}, events=child_events(one_shot_desc("quick")))
    await stack.author_child("under-one-shot", header={"parentSession": "one-shot", "createdAt": 2})
    rows = await stack.list_descendants()
    one_shot = SubagentChildRow("one-shot", "one-shot", "inactive", True, label="quick")  # type: ignore[arg-type]
    assert rows == [
        at(one_shot, "parent", 1),
        at(child("under-one-shot", "under-one-shot"), "one-shot", 2),
        at(child("under-fork", "under-fork"), "fork", 2),
    ]


@pytest.mark.parametrize(
    "events",
    [[turn_start(0), user_message(1), turn_end(2)], child_events(desc("future", v=999))],
    ids=["no-descriptor", "version-999"],
)
async def test_diagnostic_node_keeps_its_subtree(stack: Stack, events: list[dict[str, object]]) -> None:
    """A cold origin node without a usable descriptor is `corrupt` at depth 1; its child is at depth 2."""
    await stack.author_child("broken", events=events)
    await stack.author_child("kid", header={"parentSession": "broken", "createdAt": 2})
    assert await stack.list_descendants() == [at(corrupt("broken"), "parent", 1), at(child("kid", "kid"), "broken", 2)]


async def test_observation_with_a_rewritten_parent_is_corrupt(stack: Stack, spy_query: SpyQuery) -> None:
    """An observation that rewrites `parentSession`: `[{corrupt, parentId parent, depth 1}]`."""
    await stack.author_child("c1", events=child_events(desc("moved")))
    spy_query.header_changes["c1"] = {"parent_session": "new-owner"}
    assert await stack.list_descendants() == [at(corrupt("c1"), "parent", 1)]


async def test_stillborn_intermediate_keeps_its_child(stack: Stack) -> None:
    """A seeded stillborn fork intermediate is `corrupt` at depth 1 and its healthy child is at depth 2."""
    await stack.author_child("stillborn", events=stillborn_events(), cut=4)
    await stack.author_child("healthy", header={"parentSession": "stillborn", "createdAt": 2})
    assert await stack.list_descendants() == [
        at(corrupt("stillborn"), "parent", 1),
        at(child("healthy", "healthy"), "stillborn", 2),
    ]


async def test_descendants_check_services_and_cancellation_first(stack: Stack, spy_query: SpyQuery) -> None:
    """Pre-aborted → CANCELLED without `list_sessions`; no registry → PROJECTIONS_; no query → QUERY_."""
    with pytest.raises(SubagentError) as caught:
        await stack.list_descendants(signal=AbortSignal.aborted_with())
    assert caught.value.code == "CANCELLED"
    assert spy_query.lists == 0
    stack.services.projections = None
    with pytest.raises(SubagentError) as caught:
        await stack.list_descendants()
    assert caught.value.code == "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
    stack.services.projections = stack.registry
    stack.services.query = None
    with pytest.raises(SubagentError) as caught:
        await stack.list_descendants()
    assert caught.value.code == "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"


async def test_self_parented_session_is_its_own_child_with_no_descendants(stack: Stack) -> None:
    """An origin session whose `parentSession` is its own id: listed as its own child, no descendants."""
    await stack.author_child("loop", header={"parentSession": "loop"}, events=child_events(desc("self")))
    assert await stack.list_children("loop") == [child("loop", "self", has_children=True)]
    assert await stack.list_descendants("loop") == []
