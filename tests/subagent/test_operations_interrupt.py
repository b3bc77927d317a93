"""Interrupts on the real loop: the current turn stops, the inbox stays parked, and only ancestors may ask.

Layer: subagent. `interrupt` cancels a resident child's current turn with cause `parent` (an ancestor
agent) or `user` (a person acting for the parent session), keeps its queued messages parked until
the next message wakes it, and refuses callers that are the target, a sibling or a stranger.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.messages import RelaySource
from dsh.subagent.authority import AncestorAuthority, UserAuthority
from dsh.subagent.errors import SubagentError
from tests.subagent.ops_helpers import (
    HANG_GUARD_S,
    NOTED,
    ReadCounter,
    ops_runtime,
    scripted,
    settle,
    start_child,
    stored_events,
    turn_ends,
    turn_numbers,
    user_prompts,
)


async def _held(client: Any, gate: str) -> None:
    await asyncio.wait_for(client.wait_held(gate), HANG_GUARD_S)


async def test_interrupt_then_send_runs_long_work_queued_then_wake(tmp_path: Path) -> None:
    """Interrupting a running child with one queued item parks it; the next send runs [long work, queued, wake]."""
    client = scripted({"long": [{"hold": "long-gate", "text": "LONG"}, {"text": "QUEUED"}, {"text": "WAKE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "long", prompt="long work")
        await _held(client, "long-gate")
        await rt.subagents.followup(parent, child_id, "queued", source=RelaySource(parent.id))
        agent = rt.agents.get(child_id)
        assert agent is not None
        calls: list[tuple[str, bool]] = []
        cancel = agent.cancel

        def counting_cancel(cause: Any = "user", *, keep_inbox: bool = True) -> bool:
            calls.append((cause, keep_inbox))
            return cancel(cause, keep_inbox=keep_inbox)

        agent.cancel = counting_cancel  # type: ignore[method-assign]
        await rt.subagents.interrupt(child_id, AncestorAuthority(parent))
        assert calls == [("parent", True)]
        await asyncio.wait_for(agent.wait_idle(), HANG_GUARD_S)
        # Nothing runs in between: the queued item stays parked and the child stays resident.
        assert (agent.parked, agent.pending) == (True, 1)
        assert rt.subagents.activation(child_id) is not None
        assert turn_numbers(agent.session.events) == [1]
        assert turn_ends(agent.session.events) == [{"kind": "aborted", "reason": {"kind": "parent"}}]
        await rt.subagents.followup(parent, child_id, "wake", source=RelaySource(parent.id))
        await settle(rt)
        events = await stored_events(rt, child_id)
    assert user_prompts(events) == ["long work", "queued", "wake"]
    assert [reason["kind"] for reason in turn_ends(events)] == ["aborted", "completed", "completed"]
    client.assert_consumed()


async def test_an_interrupted_child_with_nothing_queued_settles_and_stays_available(tmp_path: Path) -> None:
    """With nothing queued the interrupted child settles, its parent hears it was stopped, and a send resumes it."""
    client = scripted({"stoppable": [{"hold": "stop-gate", "text": "NEVER"}, {"text": "BACK"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "stoppable")
        await _held(client, "stop-gate")
        await rt.subagents.interrupt(child_id, AncestorAuthority(parent))
        await settle(rt)
        assert rt.subagents.activation(child_id) is None
        notice = user_prompts(parent.session.events)[-1]
        assert notice.startswith(f"Subagent {child_id} was stopped before it finished.")
        await rt.subagents.followup(parent, child_id, "continue", source=RelaySource(parent.id))
        await settle(rt)
        events = await stored_events(rt, child_id)
    assert [reason["kind"] for reason in turn_ends(events)] == ["aborted", "completed"]


async def test_self_sibling_and_stranger_may_not_interrupt(tmp_path: Path) -> None:
    """The target itself, a sibling and a stranger are refused and the target keeps running; ancestors may interrupt."""
    client = scripted(
        {
            "a": {"steps": [{"hold": "a-gate", "text": "A"}], "on": [dict(NOTED)]},
            "b": [{"hold": "b-gate", "text": "B"}],
            "g": [{"hold": "g-gate", "text": "G"}],
        }
    )
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        stranger = await rt.create_agent()
        a_id = await start_child(rt, parent, "a")
        b_id = await start_child(rt, parent, "b")
        await _held(client, "a-gate")
        await _held(client, "b-gate")
        a_agent, b_agent = rt.agents.get(a_id), rt.agents.get(b_id)
        assert a_agent is not None
        assert b_agent is not None
        g_id = await start_child(rt, a_agent, "g")
        await _held(client, "g-gate")
        refusals = (
            (a_agent, "cannot interrupt itself"),
            (b_agent, "is not a live descendant"),
            (stranger, "is not a live descendant"),
        )
        for caller, expected in refusals:
            with pytest.raises(SubagentError, match=expected) as caught:
                await rt.subagents.interrupt(a_id, AncestorAuthority(caller))
            assert caught.value.code == "UNAUTHORIZED"
        assert a_agent.status == "running"
        assert turn_ends(a_agent.session.events) == []
        # The grandparent is in the grandchild's live ancestry.
        await rt.subagents.interrupt(g_id, AncestorAuthority(parent))
        client.release("a-gate")
        client.release("b-gate")
        await settle(rt)
        g_events = await stored_events(rt, g_id)
    assert turn_ends(g_events) == [{"kind": "aborted", "reason": {"kind": "parent"}}]


async def test_absent_targets_are_accepted_no_ops(tmp_path: Path) -> None:
    """A settled child and an unknown id are accepted no-ops: nothing is resumed or read."""
    client = scripted({"done": [{"text": "DONE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "done")
        await settle(rt)
        counter = ReadCounter(rt.persistence)
        for target in (child_id, "unknown"):
            await rt.subagents.interrupt(target, AncestorAuthority(parent))
            await rt.subagents.interrupt(target, UserAuthority(parent.id))
        assert rt.subagents.activation(child_id) is None
        assert counter.calls == {}
        counter.restore()


async def test_user_authority_must_name_the_durable_parent(tmp_path: Path) -> None:
    """User authority from another parent id is refused; from the parent it cancels the turn with cause `user`."""
    client = scripted({"watched": [{"hold": "watch-gate", "text": "NEVER"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "watched")
        await _held(client, "watch-gate")
        with pytest.raises(SubagentError, match="belongs to another parent session") as caught:
            await rt.subagents.interrupt(child_id, UserAuthority("someone-else"))
        assert caught.value.code == "UNAUTHORIZED"
        await rt.subagents.interrupt(child_id, UserAuthority(parent.id))
        await settle(rt)
        events = await stored_events(rt, child_id)
    assert turn_ends(events) == [{"kind": "aborted", "reason": {"kind": "user"}}]


async def test_a_caller_that_is_not_the_live_agent_is_refused_even_for_absent_targets(tmp_path: Path) -> None:
    """An ancestor authority whose agent is not the registry's live entry is refused, even for an unknown target."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        rt.agents.unregister(parent)
        try:
            with pytest.raises(SubagentError, match="exact live calling agent") as caught:
                await rt.subagents.interrupt("unknown", AncestorAuthority(parent))
        finally:
            rt.agents.register(parent)
        assert caught.value.code == "UNAUTHORIZED"
