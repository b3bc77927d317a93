"""Listing: required services, enumeration, pairing with the live store and `hasChildren`.

See docs/catalog.md#enumeration.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections import Counter
from typing import Any

import pytest

import dsh
from dsh.abort import AbortSignal
from dsh.query import SessionQuery
from dsh.query.records import SessionRecord
from dsh.session import HeaderInit, SessionHeader
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow
from tests.subagent.helpers import (
    Stack,
    child_events,
    desc,
    stored_header,
    turn_end,
    turn_start,
    user_message,
)
from tests.subagent.spies import SpyQuery


def running(child_id: str, label: str, *, has_children: bool = False) -> SubagentChildRow:
    """The row of a live continuable child."""
    return SubagentChildRow(child_id, "continuable", "running", has_children, label=label)  # type: ignore[arg-type]


def inactive(child_id: str, label: str, *, has_children: bool = False) -> SubagentChildRow:
    """The row of a cold continuable child."""
    return SubagentChildRow(child_id, "continuable", "inactive", has_children, label=label)  # type: ignore[arg-type]


def corrupt(child_id: str) -> SubagentDiagnosticRow:
    """A `corrupt` diagnostic row."""
    return SubagentDiagnosticRow(child_id, "corrupt")  # type: ignore[arg-type]


async def _code(stack: Stack, **kwargs: Any) -> str:
    with pytest.raises(SubagentError) as caught:
        await stack.list_children(**kwargs)
    return caught.value.code


# ------------------------------------------------------------------------------------------ services


async def test_missing_projections_fails_before_listing(stack: Stack, spy_query: SpyQuery) -> None:
    """Without `projections`, PROJECTIONS_UNAVAILABLE and `list_sessions` is never called."""
    stack.services.projections = None
    assert await _code(stack) == "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
    assert spy_query.lists == 0


async def test_missing_session_store_fails_before_listing(stack: Stack, spy_query: SpyQuery) -> None:
    """Projections but no `sessions`: SESSION_STORE_UNAVAILABLE, nothing listed."""
    stack.services.sessions = None
    assert await _code(stack) == "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"
    assert spy_query.lists == 0


async def test_missing_query_fails_even_with_a_live_child(stack: Stack) -> None:
    """Projections and sessions but no `query`, with a live child: QUERY_UNAVAILABLE (no live fallback)."""
    stack.live_child("live child")
    stack.services.query = None
    assert await _code(stack) == "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"


async def test_service_checks_run_in_a_fixed_order(stack: Stack) -> None:
    """None of the three services → PROJECTIONS first; only projections → SESSION_STORE."""
    stack.services.projections = None
    stack.services.sessions = None
    stack.services.query = None
    assert await _code(stack) == "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
    stack.services.projections = stack.registry
    assert await _code(stack) == "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"


async def test_configuration_errors_come_before_cancellation(stack: Stack) -> None:
    """An aborted signal and no `query` → QUERY_UNAVAILABLE, not CANCELLED."""
    stack.services.query = None
    assert await _code(stack, signal=AbortSignal.aborted_with()) == "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"


async def test_precondition_errors_are_subagent_errors_with_stable_codes(stack: Stack) -> None:
    """Precondition failures are `SubagentError`s routed by `.code`; the retired query code exists nowhere in dsh."""
    messages = {
        "projections": "listing subagents requires the projection registry (services.projections)",
        "sessions": "listing subagents requires the session store (services.sessions)",
        "query": "listing subagents requires the session query service (services.query)",
    }
    for name, message in messages.items():
        saved = getattr(stack.services, name)
        setattr(stack.services, name, None)
        with pytest.raises(SubagentError) as caught:
            await stack.list_children()
        assert isinstance(caught.value, dsh.errors.DshError)
        assert caught.value.code in SubagentError.codes
        assert caught.value.message == message
        setattr(stack.services, name, saved)
    retired = "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE"
    assert retired not in SubagentError.codes
    package = pathlib.Path(dsh.__file__).parent
    offenders = [str(path) for path in package.rglob("*.py") if retired in path.read_text(encoding="utf-8")]
    assert offenders == []


async def test_live_only_query_serves_live_children(stack: Stack) -> None:
    """A query without persistence and no `agents` service: the live child is one running row."""
    stack.services.query = SessionQuery(stack.store)
    stack.live_child("live-only child", session_id="c1")
    rows = await stack.list_children()
    assert rows == [running("c1", "live-only child")]
    assert rows[0].to_json() == {
        "kind": "child",
        "id": "c1",
        "mode": "continuable",
        "label": "live-only child",
        "activity": "running",
        "hasChildren": False,
    }


class RaisingPersistence:
    """A persistence double whose every method raises and counts the call."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        def refuse(*_args: object, **_kwargs: object) -> Any:
            self.calls[name] += 1
            raise AssertionError(f"the listing called persistence.{name}")

        return refuse


async def test_listing_never_calls_persistence(stack: Stack, spy_query: SpyQuery) -> None:
    """With a persistence double that raises on every call, cold rows are served and it is never called."""
    await stack.author_child("cold-a", events=child_events(desc("first")))
    await stack.author_child("cold-b", header={"createdAt": 2}, events=child_events(desc("second")))
    double = RaisingPersistence()
    stack.services.persistence = double  # type: ignore[assignment]
    rows = await stack.list_children()
    assert rows == [inactive("cold-a", "first"), inactive("cold-b", "second")]
    assert spy_query.observed == {"cold-a": 1, "cold-b": 1}
    assert double.calls == Counter()


# ------------------------------------------------------------------------------------------ enumeration


async def test_parent_only_in_persistence_lists_its_children(stack: Stack) -> None:
    """A parent that exists only in persistence and an authored child under it: one inactive row."""
    plain = [turn_start(0), user_message(1), turn_end(2)]
    await stack.author_child(
        "stored-parent", header={"parentSession": None, "origin": None, "delegationDepth": None}, events=plain
    )
    assert stack.store.get("stored-parent") is None
    await stack.author_child("kid", header={"parentSession": "stored-parent"}, events=child_events(desc("kid")))
    assert await stack.list_children("stored-parent") == [inactive("kid", "kid")]


async def test_rows_are_ordered_by_created_at_then_id_and_forks_are_absent(stack: Stack) -> None:
    """Live children at (9), (5, …0002), (5, …0001) and an ordinary fork: …0001, …0002, …0009."""
    stack.live_child("nine", session_id="01J0000000000000000000009", created_at=9)
    stack.live_child("two", session_id="01J0000000000000000000002", created_at=5)
    stack.live_child("one", session_id="01J0000000000000000000001", created_at=5)
    fork = stack.store.fork(stack.parent, child_id="ordinary-fork")
    assert fork.header.parent_session == "parent"
    assert fork.header.origin is None
    rows = await stack.list_children()
    assert [row.id for row in rows] == [
        "01J0000000000000000000001",
        "01J0000000000000000000002",
        "01J0000000000000000000009",
    ]


async def test_id_tie_break_is_code_point_order(stack: Stack) -> None:
    """Same `createdAt`, ids "B" and "a": "B" comes first (code point order)."""
    stack.live_child("lower", session_id="a", created_at=7)
    stack.live_child("upper", session_id="B", created_at=7)
    assert [row.id for row in await stack.list_children()] == ["B", "a"]


async def test_unknown_parent_lists_nothing(stack: Stack) -> None:
    """A parent id that exists nowhere gives `[]`, not an error (docs/catalog.md#accepted-deviations)."""
    stack.live_child("someone's child")
    await stack.author_child("cold")
    assert await stack.list_children("nobody-has-this-id") == []


async def test_corpus_failure_propagates_unchanged(stack: Stack, spy_query: SpyQuery) -> None:
    """`list_sessions` raising RuntimeError (no abort): that same exception propagates, nothing observed."""
    await stack.author_child("cold")
    failure = RuntimeError("backend listing failed")
    spy_query.list_failure = failure
    with pytest.raises(RuntimeError) as caught:
        await stack.list_children()
    assert caught.value is failure
    assert spy_query.observations == 0


async def test_record_marked_cold_but_live_in_the_store_uses_the_live_identity(
    stack: Stack, spy_query: SpyQuery
) -> None:
    """A record marked not live whose id the store holds live: `running` from the live identity, no observation."""
    stack.live_child("live now", session_id="c1")

    async def mark_cold(records: list[SessionRecord], _signal: object) -> list[SessionRecord]:
        return [SessionRecord(r.header, live=False, persisted=True) for r in records]

    spy_query.after_list = mark_cold
    assert await stack.list_children() == [running("c1", "live now")]
    assert spy_query.observations == 0
    assert stack.persistence.total_reads == 0


async def test_record_marked_live_but_gone_from_the_store_is_cold(stack: Stack, spy_query: SpyQuery) -> None:
    """A record marked live whose session left the store before pairing is cold: observed, `inactive`."""
    child = stack.live_child("left the store", session_id="c1")
    await stack.store.flush(child)

    async def dispose_after_listing(records: list[SessionRecord], _signal: object) -> list[SessionRecord]:
        spy_query.after_list = None  # the enumeration read only
        assert any(r.header.id == "c1" and r.live for r in records)
        stack.store.dispose(child)
        return records

    spy_query.after_list = dispose_after_listing
    assert await stack.list_children() == [inactive("c1", "left the store")]
    assert spy_query.observed == {"c1": 1}


async def test_live_header_wins_without_a_consistency_check(stack: Stack, spy_query: SpyQuery) -> None:
    """Persisted header names parent X, live header names Y: X lists nothing and Y a running row.

    An accepted deviation (docs/catalog.md#accepted-deviations): the two headers are not compared.
    """
    stack.live_child("under y", session_id="c1", parent="Y")

    async def persisted_under_x(records: list[SessionRecord], _signal: object) -> list[SessionRecord]:
        out = []
        for record in records:
            if record.header.id == "c1":
                header = dataclasses.replace(record.header, parent_session="X")
                out.append(SessionRecord(header, live=False, persisted=True))
            else:
                out.append(record)
        return out

    spy_query.after_list = persisted_under_x
    assert await stack.list_children("X") == []
    assert await stack.list_children("Y") == [running("c1", "under y")]
    assert spy_query.observations == 0


async def test_provider_availability_is_not_a_filter(stack: Stack) -> None:
    """A descriptor naming provider `not-mounted` is listed normally, live and cold."""
    data = {"version": 2, "mode": "continuable", "provider": "not-mounted", "label": "orphaned provider"}
    await stack.author_child("cold", events=child_events(data))
    stack.live_child(None, session_id="live", data=data)
    assert await stack.list_children() == [
        inactive("cold", "orphaned provider"),
        running("live", "orphaned provider"),
    ]


async def test_unpublished_sessions_are_neither_listed_nor_paired(stack: Stack, spy_query: SpyQuery) -> None:
    """A prepared, unpublished child is not listed, and never pairs with a persisted record of its id."""
    header = HeaderInit(parent_session="parent", origin="subagent", delegation_depth=1)
    hidden = stack.store.prepare("hidden", header=header)
    hidden.append("turn/start", {"turn": 0})
    hidden.append("subagent/descriptor", desc("not yet published"))
    await stack.author_child("twin", events=child_events(desc("persisted twin")))
    shadow = stack.store.prepare("twin", header=header)
    shadow.append("subagent/descriptor", desc("unpublished shadow"))
    assert await stack.list_children() == [inactive("twin", "persisted twin")]
    assert spy_query.observed == {"twin": 1}


# ------------------------------------------------------------------------------------------ has_children


async def test_origin_grandchild_sets_has_children_without_being_observed(stack: Stack, spy_query: SpyQuery) -> None:
    """An authored origin grandchild makes `hasChildren` true and is never observed."""
    await stack.author_child("child", events=child_events(desc("child")))
    await stack.author_child("grandchild", header={"parentSession": "child", "delegationDepth": 2})
    assert await stack.list_children() == [inactive("child", "child", has_children=True)]
    assert "grandchild" not in spy_query.observed


async def test_grandchild_without_origin_does_not_count(stack: Stack) -> None:
    """A grandchild without `origin` leaves `hasChildren` false."""
    await stack.author_child("child", events=child_events(desc("child")))
    await stack.author_child("plain", header={"parentSession": "child", "origin": None})
    assert await stack.list_children() == [inactive("child", "child")]


async def test_diagnostic_grandchild_still_counts(stack: Stack) -> None:
    """A malformed-descriptor grandchild is `corrupt` under the child and still sets `hasChildren`."""
    await stack.author_child("child", events=child_events(desc("child")))
    malformed = {"version": 2, "mode": "continuable", "provider": 7, "label": "broken"}
    await stack.author_child("grandchild", header={"parentSession": "child"}, events=child_events(malformed))
    assert await stack.list_children("child") == [corrupt("grandchild")]
    assert await stack.list_children() == [inactive("child", "child", has_children=True)]


async def test_creation_window_grandchild_counts(stack: Stack) -> None:
    """A live origin grandchild still in its creation window sets `hasChildren` on the child."""
    await stack.author_child("child", events=child_events(desc("child")))
    stack.live_child(None, session_id="grandchild", parent="child")
    assert await stack.list_children("child") == []
    assert await stack.list_children() == [inactive("child", "child", has_children=True)]


def test_authored_default_header() -> None:
    """The authored default header parses as a depth-1 origin child of `parent` with no cut."""
    header, cut = SessionHeader.from_stored(stored_header("x"))
    assert (header.parent_session, header.origin, header.delegation_depth, cut) == ("parent", "subagent", 1, 0)
