"""The catalog over children the real loop made: running rows cost no read, settled rows one at most.

Layer: subagent. The listing tests elsewhere author logs by hand; these start real children and
count every log read on the runtime's persistence coordinator.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dsh.agent.loop import Agent
from dsh.subagent.listing import ListingReport
from dsh.subagent.providers import SubagentRequest
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry
from dsh.testing.jsonl_writer import JsonlLogWriter
from tests.subagent.helpers import child_events, desc, stored_header
from tests.subagent.ops_helpers import HANG_GUARD_S, ReadCounter, ops_runtime, scripted, settle, start_child


async def test_a_running_child_lists_running_with_no_log_read(tmp_path: Path) -> None:
    """A child whose turn is streaming lists as a running continuable row; the listing reads no log."""
    client = scripted({"streaming": [{"hold": "stream-gate", "text": "DONE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "streaming")
        await asyncio.wait_for(client.wait_held("stream-gate"), HANG_GUARD_S)
        counter = ReadCounter(rt.persistence)
        reports: list[ListingReport] = []
        rows = await rt.subagents.list_children(parent.id, report=reports.append)
        assert rows == [SubagentChildRow(child_id, "continuable", "running", False, label="streaming")]  # type: ignore[arg-type]
        assert counter.calls == {}
        assert reports[0].rungs == {child_id: 1}
        counter.restore()
        client.release("stream-gate")
        await settle(rt)


async def test_a_settled_child_is_served_from_the_cache(tmp_path: Path) -> None:
    """A settled child lists `inactive` with its label; with the projection cache no log is read."""
    client = scripted({"summarize the doc": [{"text": "SUMMARY"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "summarize the doc")
        await settle(rt)
        counter = ReadCounter(rt.persistence)
        reports: list[ListingReport] = []
        rows = await rt.subagents.list_children(parent.id, report=reports.append)
        reads = counter.reads(child_id)
        counter.restore()
    assert rows == [SubagentChildRow(child_id, "continuable", "inactive", False, label="summarize the doc")]  # type: ignore[arg-type]
    assert reports[0].rungs == {child_id: 2}
    assert reads == 0


async def test_without_a_cache_a_settled_child_costs_one_observation(tmp_path: Path) -> None:
    """Without the projection cache a settled child is observed exactly once per listing."""
    client = scripted({"uncached": [{"text": "DONE"}]})
    async with ops_runtime(tmp_path, client, use_cache=False) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "uncached")
        await settle(rt)
        counter = ReadCounter(rt.persistence)
        reports: list[ListingReport] = []
        rows = await rt.subagents.list_children(parent.id, report=reports.append)
        assert (reports[0].observations, counter.reads(child_id)) == (1, 1)
        counter.restore()
    assert rows == [SubagentChildRow(child_id, "continuable", "inactive", False, label="uncached")]  # type: ignore[arg-type]


async def test_a_finished_one_shot_and_a_cold_continuable_list_inactive(tmp_path: Path) -> None:
    """A finished unlabelled one-shot child and a settled continuable child list as two inactive rows."""
    client = scripted({"one-shot": [{"text": "ONCE"}], "kept": [{"text": "KEPT"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="once"))
        await asyncio.wait_for(run.result, HANG_GUARD_S)
        child_id = await start_child(rt, parent, "kept")
        await settle(rt)
        rows = await rt.subagents.list_children(parent.id)
    assert rows == [
        SubagentChildRow(run.id, "one-shot", "inactive", False),
        SubagentChildRow(child_id, "continuable", "inactive", False, label="kept"),  # type: ignore[arg-type]
    ]
    assert "label" not in rows[0].to_json()


async def test_started_authored_and_live_children_cost_one_read_per_cold_child(tmp_path: Path) -> None:
    """Started cold, authored cold and live children give 3 rows; each cold id is read once, the live one never."""
    client = scripted({"cold": [{"text": "COLD"}], "live": [{"hold": "live-gate", "text": "LIVE"}]})
    async with ops_runtime(tmp_path, client, use_cache=False) as rt:
        parent = await rt.create_agent()
        cold_id = await start_child(rt, parent, "cold")
        await settle(rt)
        await JsonlLogWriter(rt.config.sessions_dir).write(
            "authored", stored_header("authored", parentSession=parent.id, createdAt=2), child_events(desc("authored"))
        )
        live_id = await start_child(rt, parent, "live")
        await asyncio.wait_for(client.wait_held("live-gate"), HANG_GUARD_S)
        counter = ReadCounter(rt.persistence)
        rows = await rt.subagents.list_children(parent.id)
        reads = {session_id: counter.reads(session_id) for session_id in (cold_id, "authored", live_id)}
        counter.restore()
        client.release("live-gate")
        await settle(rt)
    assert [(row.id, getattr(row, "activity", None)) for row in rows] == [
        ("authored", "inactive"),
        (cold_id, "inactive"),
        (live_id, "running"),
    ]
    assert reads == {cold_id: 1, "authored": 1, live_id: 0}


async def test_a_one_shot_child_in_its_creation_window_is_omitted(tmp_path: Path) -> None:
    """A live one-shot child before its descriptor is left out; once the descriptor lands it lists as running."""
    client = scripted({"windowed": [{"hold": "window-gate", "text": "DONE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        in_window, leave = asyncio.Event(), asyncio.Event()

        async def hold_window(agent: Agent, turn: int, step: int) -> None:
            in_window.set()
            await leave.wait()

        start_agent = rt.start_agent

        def windowed_start(*args: Any, **kwargs: Any) -> Agent:
            agent = start_agent(*args, **kwargs)
            agent.add_pre_step_hook(hold_window)  # before the driver's descriptor hook
            return agent

        rt.start_agent = windowed_start  # type: ignore[method-assign]
        try:
            run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="go", label="windowed"))
        finally:
            del rt.start_agent
        await asyncio.wait_for(in_window.wait(), HANG_GUARD_S)
        counter = ReadCounter(rt.persistence)
        assert await rt.subagents.list_children(parent.id) == []
        leave.set()
        await asyncio.wait_for(client.wait_held("window-gate"), HANG_GUARD_S)
        rows = await rt.subagents.list_children(parent.id)
        assert counter.reads(run.id) == 0
        counter.restore()
        client.release("window-gate")
        await asyncio.wait_for(run.result, HANG_GUARD_S)
    assert rows == [SubagentChildRow(run.id, "one-shot", "running", False, label="windowed")]


async def test_descendants_of_running_children_list_with_depth(tmp_path: Path) -> None:
    """A waiting child and its streaming grandchild list as running descendants in pre-order with depth."""
    client = scripted(
        {
            "middle": {"steps": [{"text": "MIDDLE"}], "on": [{"match": {"source": "subagent-settled"}, "text": "OK"}]},
            "leaf": [{"hold": "leaf-gate", "text": "LEAF"}],
        }
    )
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        middle_id = await start_child(rt, parent, "middle")
        middle = rt.agents.get(middle_id)
        assert middle is not None
        leaf_id = await start_child(rt, middle, "leaf")
        await asyncio.wait_for(client.wait_held("leaf-gate"), HANG_GUARD_S)
        rows = await rt.subagents.list_descendants(parent.id)
        client.release("leaf-gate")
        await settle(rt)
    assert rows == [
        SubagentDescendantEntry(
            SubagentChildRow(middle_id, "continuable", "running", True, label="middle"),
            parent.id,
            1,  # type: ignore[arg-type]
        ),
        SubagentDescendantEntry(
            SubagentChildRow(leaf_id, "continuable", "running", False, label="leaf"),
            middle_id,
            2,  # type: ignore[arg-type]
        ),
    ]
