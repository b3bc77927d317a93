"""`list_agents`: the catalog projected for the model, its renders, and its failures.

Stubbed catalogs and registry states run through the real tool with a direct call; missing
services and cancellation run through a real agent loop (scripted model), so the errored
`tool/result` events checked are the ones the model would see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortSignal
from dsh.agent.tools import Tool
from dsh.services import Services
from dsh.session.header import SessionId
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentDiagnosticRow
from tests.agent.helpers import HANG_GUARD_S, open_runtime, script
from tests.tools.helpers import (
    GOLDEN,
    Caller,
    StubAgent,
    StubSubagents,
    assert_golden,
    call_tool,
    registry_of,
    result_text_of,
    result_texts,
    scripted,
    tool_results,
)

CALLER = Caller("parent")


def continuable(row_id: str, label: str, *, activity: str = "inactive", has_children: bool = False) -> SubagentChildRow:
    """A continuable child row."""
    return SubagentChildRow(SessionId(row_id), "continuable", activity, has_children, label=label)  # type: ignore[arg-type]


def one_shot(row_id: str, label: str | None = None, *, activity: str = "inactive") -> SubagentChildRow:
    """A one-shot child row."""
    return SubagentChildRow(SessionId(row_id), "one-shot", activity, False, label=label)  # type: ignore[arg-type]


def diagnostic(row_id: str, reason: str) -> SubagentDiagnosticRow:
    """A diagnostic row."""
    return SubagentDiagnosticRow(SessionId(row_id), reason)  # type: ignore[arg-type]


def below(entry: Any, parent: str, depth: int) -> SubagentDescendantEntry:
    """A descendant row."""
    return SubagentDescendantEntry(entry, SessionId(parent), depth)


async def test_no_rows_render_no_subagents_and_are_not_an_error(tools: dict[str, Tool]) -> None:
    """An empty catalog renders `(no subagents)` as a normal result, listed for the caller with the call's signal."""
    stub = StubSubagents()
    outcome = await call_tool(tools["list_agents"], {}, agent=CALLER, services=Services(subagents=stub))  # type: ignore[arg-type]
    assert (outcome.is_error, outcome.text, outcome.output) == (False, "(no subagents)", [])
    assert len(stub.calls) == 1
    scope, caller_id, signal = stub.calls[0]
    assert (scope, caller_id) == ("children", "parent")
    assert isinstance(signal, AbortSignal)


async def test_children_drop_one_shots_and_take_status_from_the_agent_registry(tools: dict[str, Tool]) -> None:
    """One-shot rows are dropped, diagnostics kept, and status comes from the registry, never the catalog's activity."""
    stub = StubSubagents(
        children=[
            one_shot("shot", "Quick look", activity="running"),
            continuable("stored", "Draft outline", activity="running"),
            continuable("busy", "Check links"),
            continuable("between", "Summarise notes", activity="running"),
            diagnostic("broken", "corrupt"),
        ]
    )
    agents = registry_of(StubAgent("busy", "running"), StubAgent("between", "idle"), StubAgent("shot", "running"))
    services = Services(subagents=stub, agents=agents)  # type: ignore[arg-type]
    outcome = await call_tool(tools["list_agents"], {"scope": "children"}, agent=CALLER, services=services)
    assert outcome.text.split("\n") == [
        "stored [ready] \u2014 Draft outline",
        "busy [running] \u2014 Check links",
        "between [idle] \u2014 Summarise notes",
        "broken [diagnostic: corrupt]",
    ]
    assert outcome.output == [
        {"kind": "child", "id": "stored", "label": "Draft outline", "status": "ready"},
        {"kind": "child", "id": "busy", "label": "Check links", "status": "running"},
        {"kind": "child", "id": "between", "label": "Summarise notes", "status": "idle"},
        {"kind": "diagnostic", "id": "broken", "reason": "corrupt"},
    ]


async def test_descendants_show_parent_and_depth_and_keep_children_of_a_dropped_one_shot(
    tools: dict[str, Tool],
) -> None:
    """With scope descendants a continuable leaf under a dropped one-shot still shows, with its parent and depth."""
    stub = StubSubagents(
        descendants=[
            below(one_shot("mid", "Middle step"), "parent", 1),
            below(continuable("leaf", "Leaf work"), "mid", 2),
            below(diagnostic("broken", "unavailable"), "parent", 1),
        ]
    )
    outcome = await call_tool(
        tools["list_agents"],
        {"scope": "descendants"},
        agent=CALLER,
        services=Services(subagents=stub),  # type: ignore[arg-type]
    )
    assert outcome.text.split("\n") == [
        "leaf [ready] parent=mid depth=2 \u2014 Leaf work",
        "broken [diagnostic: unavailable] parent=parent depth=1",
    ]
    assert outcome.output == [
        {"kind": "child", "id": "leaf", "label": "Leaf work", "status": "ready", "parent": "mid", "depth": 2},
        {"kind": "diagnostic", "id": "broken", "reason": "unavailable", "parent": "parent", "depth": 1},
    ]
    assert [call[:2] for call in stub.calls] == [("descendants", "parent")]


async def test_without_a_subagent_service_list_agents_fails_instead_of_listing_nothing(tools: dict[str, Tool]) -> None:
    """A runtime without `services.subagents` gets an errored result, never `(no subagents)`."""
    outcome = await call_tool(tools["list_agents"], {}, agent=CALLER, services=Services())
    assert outcome.is_error
    assert outcome.text == "Error: list_agents requires the subagent service (services.subagents is not mounted)"


# name -> (stubbed catalog, registry states, arguments)
_GOLDEN_CASES: dict[str, tuple[StubSubagents, list[StubAgent], Mapping[str, Any]]] = {
    "empty": (StubSubagents(), [], {}),
    "mixed_children": (
        StubSubagents(
            children=[
                continuable("c-ready", "Draft outline"),
                continuable("c-running", "Check links", activity="running"),
                one_shot("c-shot", "Quick look"),
                continuable("c-idle", "Summarise notes"),
            ]
        ),
        [StubAgent("c-running", "running"), StubAgent("c-idle", "idle")],
        {},
    ),
    "diagnostics": (
        StubSubagents(
            children=[
                diagnostic("d-corrupt", "corrupt"),
                continuable("c-ready", "Draft outline"),
                diagnostic("d-gone", "unavailable"),
            ]
        ),
        [],
        {"scope": "children"},
    ),
    "descendants_one_shot_intermediate": (
        StubSubagents(
            descendants=[
                below(continuable("c-top", "Plan chapters", has_children=True), "parent", 1),
                below(one_shot("s-mid", "Research step", activity="running"), "c-top", 2),
                below(continuable("c-leaf", "Collect sources"), "s-mid", 3),
                below(diagnostic("d-deep", "corrupt"), "c-top", 2),
            ]
        ),
        [StubAgent("c-top", "idle"), StubAgent("c-leaf", "running")],
        {"scope": "descendants"},
    ),
    "unlabeled_one_shot": (
        StubSubagents(children=[one_shot("s-plain"), continuable("c-ready", "Draft outline")]),
        [],
        {},
    ),
}


@pytest.mark.parametrize("case", sorted(_GOLDEN_CASES))
async def test_renders_match_the_golden_listings(tools: dict[str, Tool], case: str) -> None:
    """Stubbed catalogs and registry states render exactly as `tests/golden/list_agents/<case>.txt`."""
    stub, agents, arguments = _GOLDEN_CASES[case]
    services = Services(subagents=stub, agents=registry_of(*agents))  # type: ignore[arg-type]
    outcome = await call_tool(tools["list_agents"], arguments, agent=CALLER, services=services)
    assert not outcome.is_error
    assert_golden(GOLDEN / "list_agents" / f"{case}.txt", outcome.text + "\n")


_LIST_ONCE = [{"toolCalls": [{"name": "list_agents", "arguments": {}}]}, {"text": "LISTED"}]


@pytest.mark.parametrize(
    ("service", "code"),
    [
        ("query", "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"),
        ("projections", "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"),
        ("sessions", "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"),
    ],
)
async def test_a_missing_listing_service_is_an_errored_result_with_its_code(
    tmp_path: Path, service: str, code: str
) -> None:
    """Without the query service, projection registry or session store, the model sees an error carrying the code."""
    async with open_runtime(tmp_path, script(_LIST_ONCE)) as rt:
        agent = await rt.create_agent()
        mounted = getattr(rt.services, service)
        setattr(rt.services, service, None)
        try:
            result = await agent.turn_result(await agent.send("who is there?"))
        finally:
            setattr(rt.services, service, mounted)
        events = list(agent.session.events)
    assert result.stop_reason == "completed"
    [data] = tool_results(events)
    assert data["message"]["content"][0]["isError"] is True
    assert data["error"] == {"name": "SubagentError", "code": code}
    [shown] = result_texts(events)
    assert shown.startswith("Error: listing subagents requires")
    assert "(no subagents)" not in shown


async def test_cancelling_the_call_aborts_a_held_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling the turn aborts a held listing's signal, and the result is the cancelled-call text."""
    held = asyncio.Event()
    seen: list[AbortSignal] = []

    async def held_listing(parent_session_id: str, *, signal: AbortSignal | None = None, **_: Any) -> list[Any]:
        assert signal is not None
        seen.append(signal)
        held.set()
        await signal.wait()
        raise SubagentError("subagent listing was cancelled", "CANCELLED")

    async with open_runtime(tmp_path, script(_LIST_ONCE[:1])) as rt:
        monkeypatch.setattr(rt.subagents, "list_children", held_listing)
        agent = await rt.create_agent()
        message_id = await agent.send("who is there?")
        async with asyncio.timeout(HANG_GUARD_S):
            await held.wait()
            assert agent.cancel("user") is True
            result = await agent.turn_result(message_id)
        events = list(agent.session.events)
    assert seen[0].aborted
    assert result.stop_reason == "aborted"
    assert result_texts(events) == ["Error: tool call was cancelled"]
    assert tool_results(events)[0]["message"]["content"][0]["isError"] is True


async def test_descendants_of_real_children_show_an_idle_branch_and_its_running_leaf(tmp_path: Path) -> None:
    """A child idle while its own child runs lists `[idle] parent=<caller> depth=1`, its child `[running]` depth=2."""
    noted = [{"match": {"source": "subagent-settled"}, "text": "NOTED"}]
    background = {"description": "waiting branch", "prompt": "Branch out.", "run_in_background": True}
    nested = {"description": "nested leaf", "prompt": "Work for a while.", "run_in_background": True}
    model = scripted(
        {
            "main": {
                "steps": [
                    {
                        "match": {"lastUser": "Start a branch."},
                        "toolCalls": [{"name": "agent", "arguments": background}],
                    },
                    {"text": "STARTED"},
                    {
                        "match": {"lastUser": "Who works for you?"},
                        "toolCalls": [{"name": "list_agents", "arguments": {"scope": "descendants"}}],
                    },
                    {"text": "LISTED"},
                ],
                "on": noted,
            },
            "waiting branch": {
                "steps": [{"toolCalls": [{"name": "agent", "arguments": nested}]}, {"text": "BRANCH_STARTED"}],
                "on": noted,
            },
            "nested leaf": {"steps": [{"hold": "leaf", "text": "LEAF_DONE"}]},
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Start a branch."))
        [started] = result_texts(list(parent.session.events))
        branch_id = started.removeprefix("started subagent ")
        branch = rt.agents.get(branch_id)
        assert branch is not None
        async with asyncio.timeout(HANG_GUARD_S):
            await model.wait_held("leaf")
            await branch.wait_idle()
            [branch_started] = result_texts(list(branch.session.events))
            leaf_id = branch_started.removeprefix("started subagent ")
            result = await parent.turn_result(await parent.send("Who works for you?"))
            model.release("leaf")
            await rt.settle(HANG_GUARD_S)
        [_, listed] = tool_results(list(parent.session.events))
    assert result.output == "LISTED"
    assert listed["message"]["content"][0]["isError"] is False
    assert result_text_of(listed).split("\n") == [
        f"{branch_id} [idle] parent={parent.id} depth=1 \u2014 waiting branch",
        f"{leaf_id} [running] parent={branch_id} depth=2 \u2014 nested leaf",
    ]
    model.assert_consumed()
