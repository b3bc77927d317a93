"""Observed identity: one observation per cold child, the own-suffix check and the lifecycle witness.

A seeded cold child, and every unseeded one the cache cannot answer, is read once per listing and its
identity folded by the `subagent` unit (docs/catalog.md#observed-identity). The identity must come from
the child's own suffix, and the observed header must match the enumerated one on every witness field
(docs/catalog.md#lifecycle-witness), or the row is a diagnostic.
"""

from __future__ import annotations

import ast
import inspect

import orjson
import pytest

import dsh.subagent.listing as listing_module
from dsh.query import SessionQueryError
from dsh.session import HeaderInit, SessionStore
from dsh.session.events import SurfaceReplace
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow
from tests.subagent.helpers import (
    Record,
    Stack,
    child_events,
    desc,
    descriptor,
    fork_events,
    one_shot_desc,
    stillborn_events,
    turn_end,
    turn_start,
)
from tests.subagent.spies import SpyQuery


def inactive(child_id: str, label: str | None, *, mode: str = "continuable") -> SubagentChildRow:
    """The row of a cold child."""
    return SubagentChildRow(child_id, mode, "inactive", False, label=label)  # type: ignore[arg-type]


def diagnostic(child_id: str, reason: str = "corrupt") -> SubagentDiagnosticRow:
    """A diagnostic row."""
    return SubagentDiagnosticRow(child_id, reason)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ observed identity


async def test_seeded_cold_child_is_observed_once_per_listing(stack: Stack, spy_query: SpyQuery) -> None:
    """A seeded cold fork child: exactly one `observe_session` per listing, row with the own label."""
    await stack.author_child("fork", events=fork_events(desc("own label")), cut=4)
    assert await stack.list_children() == [inactive("fork", "own label")]
    assert spy_query.observed == {"fork": 1}
    assert await stack.list_children() == [inactive("fork", "own label")]
    assert spy_query.observed == {"fork": 2}
    assert stack.persistence.reads["fork"] == 2


async def test_stillborn_fork_is_corrupt(stack: Stack) -> None:
    """A fork whose whole log is the seed (ancestor descriptor, cut 4) is `corrupt`, not the ancestor."""
    await stack.author_child("stillborn", events=stillborn_events(), cut=4)
    assert await stack.list_children() == [diagnostic("stillborn")]


async def test_own_descriptor_after_the_cut_wins(stack: Stack, spy_query: SpyQuery) -> None:
    """Cut 4, ancestor descriptor at seq 2, own `own label` at seq 5: the own label, observed once."""
    await stack.author_child("fork", events=fork_events(desc("own label"), own_seq=5), cut=4)
    assert await stack.list_children() == [inactive("fork", "own label")]
    assert spy_query.observed == {"fork": 1}


async def test_own_descriptor_exactly_at_the_cut_is_accepted(stack: Stack) -> None:
    """Cut 4 and the own descriptor exactly at seq 4: a normal row (equality boundary)."""
    events = fork_events(desc("at the cut"), own_seq=4)
    assert events[4]["seq"] == 4
    assert events[4]["type"] == "subagent/descriptor"
    await stack.author_child("fork", events=events, cut=4)
    assert await stack.list_children() == [inactive("fork", "at the cut")]


async def test_malformed_own_descriptor_never_shows_the_ancestor(stack: Stack) -> None:
    """A seeded child whose own descriptor is malformed after a valid ancestor one is `corrupt`."""
    malformed = {"version": 2, "mode": "continuable", "provider": "spawn"}  # continuable without a label
    await stack.author_child("fork", events=fork_events(malformed), cut=4)
    rows = await stack.list_children()
    assert rows == [diagnostic("fork")]
    assert "ancestor label" not in orjson.dumps([row.to_json() for row in rows]).decode()


async def test_read_failure_is_unavailable_and_retried(stack: Stack, spy_query: SpyQuery) -> None:
    """`observe_session` raising for one child: `unavailable`, sibling intact; the next listing retries."""
    await stack.author_child("failing", events=child_events(desc("real row")))
    await stack.author_child("sibling", header={"createdAt": 2}, events=child_events(desc("sibling")))
    spy_query.failures["failing"] = SessionQueryError(
        "backend down", code="SESSION_QUERY_PERSISTENCE_FAILED", session_id="failing"
    )
    assert await stack.list_children() == [diagnostic("failing", "unavailable"), inactive("sibling", "sibling")]
    del spy_query.failures["failing"]
    assert await stack.list_children() == [inactive("failing", "real row"), inactive("sibling", "sibling")]
    assert spy_query.observed == {"failing": 2, "sibling": 2}


async def test_rejected_surface_is_unavailable(stack: Stack) -> None:
    """A `user/message` without `surfaceOp`, which the observation rejects, is `unavailable`.

    An accepted deviation (docs/catalog.md#accepted-deviations): a failed read cannot tell damage from other causes.
    """
    events = child_events(desc("unreadable"))
    del events[1]["surfaceOp"]
    await stack.author_child("c1", events=events)
    assert await stack.list_children() == [diagnostic("c1", "unavailable")]


async def test_several_own_descriptors_last_one_wins(stack: Stack) -> None:
    """Own descriptors `twice` then `twice again`: the row shows `twice again`, as the unit is last-wins.

    An accepted deviation (docs/catalog.md#accepted-deviations): a child should hold exactly one descriptor.
    """
    events = [*child_events(desc("twice")), descriptor(4, desc("twice again"))]
    await stack.author_child("twice", events=events)
    await stack.author_child("sibling", header={"createdAt": 2}, events=child_events(desc("sibling")))
    assert await stack.list_children() == [inactive("twice", "twice again"), inactive("sibling", "sibling")]


async def test_valid_then_malformed_descriptor_is_corrupt(stack: Stack) -> None:
    """A settled log with a valid descriptor and then a malformed one: `[corrupt]`."""
    events = [*child_events(desc("valid")), descriptor(4, {"version": 2, "mode": "sideways", "provider": "spawn"})]
    await stack.author_child("c1", events=events)
    assert await stack.list_children() == [diagnostic("c1")]


@pytest.mark.parametrize(
    "payload",
    [
        {"version": 2, "mode": "continuable", "provider": 7, "label": "bad provider"},
        {"version": 3, "mode": "continuable", "provider": "spawn", "label": "future"},
    ],
    ids=["provider-7", "version-3"],
)
async def test_bad_provider_or_unknown_version_is_corrupt(stack: Stack, payload: Record) -> None:
    """`provider: 7` and version 3 are both `corrupt` (never `unsupported`)."""
    await stack.author_child("c1", events=child_events(payload))
    assert await stack.list_children() == [diagnostic("c1")]


async def test_one_shot_cancelled_before_its_first_step_is_corrupt(stack: Stack) -> None:
    """A one-shot child cancelled before its first step (origin, no descriptor) is `corrupt`."""
    await stack.author_child("c1", events=[turn_start(0), turn_end(1, kind="aborted")])
    assert await stack.list_children() == [diagnostic("c1")]


def _twin_log(*, compacted: bool) -> list[Record]:
    """A one-shot child's log built through a scratch store; optionally with a compaction replacement."""
    scratch = SessionStore(clock=iter(range(10, 1000)).__next__)
    session = scratch.create("scratch", header=HeaderInit(parent_session="parent", origin="subagent"))
    session.append("turn/start", {"turn": 0})
    session.append("subagent/descriptor", one_shot_desc("twin"))
    message = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "long task"}]}
    session.append("user/message", {**message, "source": {"kind": "user"}})
    session.append("turn/end", {"turn": 0, "reason": {"kind": "completed"}})
    if compacted:
        summary = {"id": "s1", "role": "user", "content": [{"type": "text", "text": "summary"}]}
        session.append("compaction/start", {})
        session.append(
            "user/message",
            {**summary, "source": {"kind": "user"}},
            surface_op=SurfaceReplace(2, 2),
            source_event_seqs=[2],
        )
        session.append("compaction/end", {})
    return [orjson.loads(orjson.dumps(event)) for event in session.events]


async def test_twin_one_shots_list_alike_with_or_without_compaction(stack: Stack) -> None:
    """Twin one-shot children, the second with an extra compaction replacement: equal rows, createdAt order."""
    compacted = _twin_log(compacted=True)
    assert any(isinstance(e.get("surfaceOp"), dict) for e in compacted)
    await stack.author_child("twin-b", header={"createdAt": 2}, events=compacted)
    await stack.author_child("twin-a", header={"createdAt": 1}, events=_twin_log(compacted=False))
    rows = await stack.list_children()
    assert rows == [inactive("twin-a", "twin", mode="one-shot"), inactive("twin-b", "twin", mode="one-shot")]


async def test_cold_child_whose_subagent_unit_raises_is_corrupt(stack: Stack, hostile_subagent_unit: None) -> None:
    """With `hostile_subagent_unit`, a cold `poison me` child is `corrupt` and its cold sibling normal."""
    await stack.author_child("healthy", events=child_events(desc("healthy")))
    await stack.author_child("poisoned", header={"createdAt": 2}, events=child_events(desc("poison me")))
    assert await stack.list_children() == [inactive("healthy", "healthy"), diagnostic("poisoned")]


def test_listing_imports_no_descriptor_parser() -> None:
    """`dsh.subagent.listing` imports neither `parse_descriptor` nor the resume fold."""
    tree = ast.parse(inspect.getsource(listing_module))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    forbidden = {"parse_descriptor", "fold_descriptor_for_resume", "dsh.subagent.descriptor"}
    assert imported.isdisjoint(forbidden)
    assert not hasattr(listing_module, "parse_descriptor")
    assert not hasattr(listing_module, "fold_descriptor_for_resume")


# ------------------------------------------------------------------------------------------ lifecycle witness


WITNESS_CHANGES: list[tuple[str, dict[str, object], int | None]] = [
    ("version", {"version": 1}, None),
    ("id", {"id": "someone-else"}, None),
    ("createdAt", {"created_at": 2}, None),
    ("cwd", {"cwd": "/elsewhere"}, None),
    ("parentSession", {"parent_session": "another-parent"}, None),
    ("isSeeded", {"is_seeded": True}, 4),
    ("delegationDepth", {"delegation_depth": 2}, None),
    ("origin", {"origin": None}, None),
    ("agentPreset", {"agent_preset": "another-preset"}, None),
]


@pytest.mark.parametrize(
    ("changes", "cut"), [(c, k) for _, c, k in WITNESS_CHANGES], ids=[n for n, _, _ in WITNESS_CHANGES]
)
async def test_witness_field_mismatch_is_corrupt(
    stack: Stack, spy_query: SpyQuery, changes: dict[str, object], cut: int | None
) -> None:
    """An observed header differing on one witness field: the child is `corrupt`, its sibling normal."""
    await stack.author_child("changed", events=child_events(desc("must not leak")))
    await stack.author_child("sibling", header={"createdAt": 2}, events=child_events(desc("sibling")))
    spy_query.header_changes["changed"] = changes
    if cut is not None:
        spy_query.cut_changes["changed"] = cut
    rows = await stack.list_children()
    assert rows == [diagnostic("changed"), inactive("sibling", "sibling")]
    assert "must not leak" not in orjson.dumps([row.to_json() for row in rows]).decode()


async def test_absent_delegation_depth_equals_zero(stack: Stack, spy_query: SpyQuery) -> None:
    """A listed header without `delegationDepth` and an observed one with 0: served (normalized comparison)."""
    header = await stack.author_child("c1", header={"delegationDepth": None}, events=child_events(desc("depth")))
    assert header.delegation_depth == 0
    spy_query.header_changes["c1"] = {"delegation_depth": 0}
    assert await stack.list_children() == [inactive("c1", "depth")]
