"""Settlement, the parent notice and the drain on close, on the real loop.

Layer: subagent. A settled continuable child is disposed and its parent is told, as the parent's
next turn; a child owning live children waits; closing the runtime disposes every resident child
child-first, ends open turns as `disposed` and refuses new work with `DRAINING`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.messages import RelaySource
from dsh.subagent.activation import settled_notice
from dsh.subagent.errors import SubagentError
from dsh.subagent.providers import ContinuableSpec, SubagentRequest
from tests.subagent.ops_helpers import (
    HANG_GUARD_S,
    NOTED,
    LifecycleLog,
    data,
    ops_runtime,
    scripted,
    settle,
    start_child,
    turn_ends,
    turn_numbers,
    user_prompts,
    user_sources,
)


def test_notice_wording_by_stop_reason() -> None:
    """The notice's first line says what happened, by stop reason; then the closing message, or that there is none."""
    lines = {
        reason: settled_notice("c1", reason, ())[0]
        for reason in ("completed", "aborted", "max-tokens", "refusal", "error", "odd")
    }
    assert lines == {
        "completed": "Subagent c1 finished and will do no further work unless it is sent more.",
        "aborted": "Subagent c1 was stopped before it finished.",
        "max-tokens": "Subagent c1 ran out of room before it finished.",
        "refusal": "Subagent c1 declined the task.",
        "error": "Subagent c1 failed before it finished.",
        "odd": "Subagent c1 ended abnormally (odd).",
    }
    summary, empty = settled_notice("c1", "error", ())
    assert empty == [{"type": "text", "text": f"{summary}\nIt left no closing message."}]
    _, closing = settled_notice("c1", "completed", ({"type": "text", "text": "ALL DONE"},))
    assert closing == [
        {
            "type": "text",
            "text": "Subagent c1 finished and will do no further work unless it is sent more.\nIts closing message:\n",
        },
        {"type": "text", "text": "ALL DONE"},
    ]


async def test_an_idle_parent_gets_one_notice_turn(tmp_path: Path) -> None:
    """A child that settles with output gives its idle parent exactly one turn, whose message is the notice."""
    client = scripted({"reporter": [{"text": "REPORT READY"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        child_id = await start_child(rt, parent, "reporter")
        await settle(rt)
    first_line = f"Subagent {child_id} finished and will do no further work unless it is sent more."
    assert turn_numbers(parent.session.events) == [1]
    assert user_prompts(parent.session.events) == [f"{first_line}\nIts closing message:\nREPORT READY"]
    assert user_sources(parent.session.events) == [
        {"kind": "subagent-settled", "form": "notice", "summary": first_line, "senderSessionId": child_id}
    ]
    (end,) = log.of("subagent/end")
    assert (end["stopReason"], end["hasOutput"], end["lastAssistantMessage"]) == ("completed", True, "REPORT READY")
    (start,) = log.of("subagent/start")
    assert {key: start[key] for key in ("provider", "parentSessionId", "childSessionId", "local")} == {
        "provider": "spawn",
        "parentSessionId": parent.id,
        "childSessionId": child_id,
        "local": True,
    }
    assert start["runId"] == end["runId"]


async def test_a_busy_parent_gets_the_notice_as_its_next_turn(tmp_path: Path) -> None:
    """A parent in the middle of a turn gets the notice after that turn, as a turn of its own (never inside it)."""
    client = scripted({"main": [{"hold": "parent-gate", "text": "PARENT WORK DONE"}], "quick": [{"text": "QUICK"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        await parent.send("work")
        await asyncio.wait_for(client.wait_held("parent-gate"), HANG_GUARD_S)
        child_id = await start_child(rt, parent, "quick")
        child = rt.agents.get(child_id)
        assert child is not None
        await asyncio.wait_for(child.wait_idle(), HANG_GUARD_S)
        await asyncio.wait_for(rt.subagents.settled(), HANG_GUARD_S)
        assert parent.pending == 1
        assert user_prompts(parent.session.events) == ["work"]
        client.release("parent-gate")
        await settle(rt)
    assert turn_numbers(parent.session.events) == [1, 2]
    assert [source["kind"] for source in user_sources(parent.session.events)] == ["user", "subagent-settled"]


async def test_a_child_owning_live_children_waits_and_settles_after_them(tmp_path: Path) -> None:
    """A child whose own child still runs is `waiting`; the grandchild settles first, then the child."""
    client = scripted(
        {
            "middle": {"steps": [{"hold": "middle-gate", "text": "MIDDLE"}], "on": [dict(NOTED)]},
            "leaf": [{"hold": "leaf-gate", "text": "LEAF"}],
        }
    )
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        middle_id = await start_child(rt, parent, "middle")
        await asyncio.wait_for(client.wait_held("middle-gate"), HANG_GUARD_S)
        middle = rt.agents.get(middle_id)
        assert middle is not None
        leaf_id = await start_child(rt, middle, "leaf")
        client.release("middle-gate")
        await asyncio.wait_for(middle.wait_idle(), HANG_GUARD_S)
        activation = rt.subagents.activation(middle_id)
        assert activation is not None
        assert activation.status == "waiting"
        client.release("leaf-gate")
        await settle(rt)
    assert [end["childSessionId"] for end in log.of("subagent/end")] == [leaf_id, middle_id]
    assert [source["senderSessionId"] for source in user_sources(middle.session.events)[1:]] == [leaf_id]
    assert [source["senderSessionId"] for source in user_sources(parent.session.events)] == [middle_id]


async def test_a_notice_for_a_parent_that_is_gone_is_dropped(tmp_path: Path) -> None:
    """When the parent is no longer live the notice is dropped silently; the child is still disposed and ends."""
    client = scripted({"orphan": [{"hold": "orphan-gate", "text": "ORPHAN"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        child_id = await start_child(rt, parent, "orphan")
        await parent.aclose()
        rt.agents.unregister(parent)
        client.release("orphan-gate")
        await settle(rt)
        assert rt.subagents.activation(child_id) is None
    assert [end["stopReason"] for end in log.ends_for(child_id)] == ["completed"]
    assert user_prompts(parent.session.events) == []


async def test_closing_drains_children_first_and_refuses_new_work(tmp_path: Path) -> None:
    """Closing disposes a child after its mid-turn grandchild, ends open turns `disposed`, refuses new work."""
    client = scripted(
        {
            "main": [{"hold": "parent-gate", "text": "NEVER"}],
            "outer": [{"hold": "outer-gate", "text": "OUTER"}],
            "inner": [{"hold": "inner-gate", "text": "NEVER"}],
        }
    )
    refused: list[str] = []
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        await parent.send("work")
        await asyncio.wait_for(client.wait_held("parent-gate"), HANG_GUARD_S)
        log = LifecycleLog(rt)
        outer_id = await start_child(rt, parent, "outer")
        await asyncio.wait_for(client.wait_held("outer-gate"), HANG_GUARD_S)
        outer = rt.agents.get(outer_id)
        assert outer is not None
        inner_id = await start_child(rt, outer, "inner")
        await asyncio.wait_for(client.wait_held("inner-gate"), HANG_GUARD_S)
        inner = rt.agents.get(inner_id)
        assert inner is not None
        client.release("outer-gate")
        await asyncio.wait_for(outer.wait_idle(), HANG_GUARD_S)
        assert rt.subagents.activation(outer_id).status == "waiting"  # type: ignore[union-attr]

        def try_new_work(event: Mapping[str, Any]) -> None:
            # Runs inside the drain (the first child just ended); both calls refuse before any await.
            if event["type"] != "subagent/end" or event["childSessionId"] != inner_id:
                return
            for attempt in (
                rt.subagents.start_continuable(ContinuableSpec(parent=parent, prompt="late", label="late")),
                rt.subagents.followup(parent, outer_id, "late", source=RelaySource(parent.id)),
            ):
                try:
                    attempt.send(None)
                except SubagentError as error:
                    refused.append(error.code)
                else:
                    attempt.close()
                    refused.append("accepted")

        rt.subagents.on_event(try_new_work)
    assert refused == ["DRAINING", "DRAINING"]
    assert [end["childSessionId"] for end in log.of("subagent/end")] == [inner_id, outer_id]
    assert [end["stopReason"] for end in log.of("subagent/end")] == ["aborted", "completed"]
    disposed = {"kind": "aborted", "reason": {"kind": "disposed"}}
    assert turn_ends(inner.session.events) == [disposed]
    assert turn_ends(parent.session.events) == [disposed]
    assert [data(event)["reason"]["kind"] for event in outer.session.events if event.type == "turn/end"] == [
        "completed"
    ]
    assert user_prompts(parent.session.events) == ["work"]  # a closing runtime wakes nobody with notices


async def test_after_close_every_operation_is_draining(tmp_path: Path) -> None:
    """Once closed, the runtime refuses continuable starts, one-shot starts and follow-ups with `DRAINING`."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        await rt.subagents.aclose()
        with pytest.raises(SubagentError) as start:
            await start_child(rt, parent, "late")
        with pytest.raises(SubagentError) as followup:
            await rt.subagents.followup(parent, "x", "late", source=RelaySource(parent.id))
        assert (start.value.code, followup.value.code) == ("DRAINING", "DRAINING")


async def test_a_runtime_closed_before_it_ran_a_child_refuses_one_shots_too(tmp_path: Path) -> None:
    """Closed before any child ran (no provider built yet), the runtime still refuses a one-shot with `DRAINING`."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        await rt.subagents.aclose()
        with pytest.raises(SubagentError) as one_shot:
            await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="late"))
        assert one_shot.value.code == "DRAINING"
        assert rt.subagents.providers() == ("spawn", "fork")
        assert rt.subagents.activation("late") is None


async def test_a_failing_release_is_reported_as_a_teardown_failure(tmp_path: Path) -> None:
    """When closing a child's agent fails, the drain raises `ACTIVATION_TEARDOWN_FAILED` and the end says `error`."""
    client = scripted({"fragile": [{"hold": "fragile-gate", "text": "NEVER"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        child_id = await start_child(rt, parent, "fragile")
        await asyncio.wait_for(client.wait_held("fragile-gate"), HANG_GUARD_S)
        child = rt.agents.get(child_id)
        assert child is not None
        aclose = child.aclose

        async def failing_aclose(**kwargs: Any) -> None:
            await aclose(**kwargs)
            raise OSError("the handle would not close")

        child.aclose = failing_aclose  # type: ignore[method-assign]
        with pytest.raises(SubagentError) as caught:
            await rt.subagents.aclose()
        assert caught.value.code == "ACTIVATION_TEARDOWN_FAILED"
        assert isinstance(caught.value.__cause__, OSError)
        assert rt.subagents.activation(child_id) is None
    (end,) = log.ends_for(child_id)
    assert (end["stopReason"], end["hasOutput"]) == ("error", False)
