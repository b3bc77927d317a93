"""`interrupt_agent` through a real agent loop: a running child stops its turn, keeps its inbox; refusals and no-ops.

Every test runs a real `Runtime` with the scripted model; a child that should be running holds its
stream on a named gate that is never released, so only the interrupt can end its turn.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.agent.helpers import HANG_GUARD_S, open_runtime
from tests.tools.helpers import PhasedModel, result_text_of, result_texts, scripted, stored, tool_results

_NOTED = [{"match": {"source": "subagent-settled"}, "text": "NOTED"}]


def _background(description: str) -> dict[str, Any]:
    arguments = {"description": description, "prompt": "Work for a long time.", "run_in_background": True}
    return {"name": "agent", "arguments": arguments}


def _interrupt(agent_id: str) -> dict[str, Any]:
    return {"name": "interrupt_agent", "arguments": {"agent_id": agent_id}}


async def test_interrupt_stops_a_running_childs_turn_and_keeps_its_inbox(tmp_path: Path) -> None:
    """The child's turn ends aborted by its parent, and a message queued before the interrupt stays parked."""
    model = scripted(
        {
            "main": {
                "steps": [
                    {"match": {"lastUser": "Start long work."}, "toolCalls": [_background("Long work")]},
                    {"text": "STARTED"},
                    {
                        "match": {"lastUser": "Stop it."},
                        "toolCalls": [
                            {
                                "name": "send_message",
                                "arguments": {"subagent_id": "${child:Long work}", "message": "Queued work."},
                            },
                            _interrupt("${child:Long work}"),
                        ],
                    },
                    {"text": "STOPPED"},
                ],
                "on": _NOTED,
            },
            "Long work": {"steps": [{"hold": "long", "text": "working"}]},
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Start long work."))
        [started] = result_texts(list(parent.session.events))
        child_id = started.removeprefix("started subagent ")
        async with asyncio.timeout(HANG_GUARD_S):
            await model.wait_held("long")
            result = await parent.turn_result(await parent.send("Stop it."))
            child = rt.agents.get(child_id)
            assert child is not None
            await child.wait_idle()
        _, queued, interrupted = tool_results(list(parent.session.events))
        parked, pending = child.parked, child.pending
        _, child_events = await stored(rt, child_id)
    assert result.output == "STOPPED"
    assert result_text_of(queued) == f"message queued as the next turn for subagent {child_id}"
    assert result_text_of(interrupted) == f"interrupt requested for agent {child_id}"
    assert interrupted["message"]["content"][0]["output"] == {"accepted": True}
    [end] = [e for e in child_events if e.type == "turn/end"]
    assert end.data["reason"] == {"kind": "aborted", "reason": {"kind": "parent"}}
    assert (parked, pending) == (True, 1)


async def test_an_agent_cannot_interrupt_itself(tmp_path: Path) -> None:
    """Naming oneself is refused with `cannot interrupt itself`."""
    model = scripted({"main": {"steps": [{"toolCalls": [_interrupt("${self}")]}, {"text": "DONE"}]}})
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Interrupt yourself."))
        [data] = tool_results(list(parent.session.events))
    assert data["message"]["content"][0]["isError"] is True
    assert "cannot interrupt itself" in result_text_of(data)
    assert data["error"] == {"name": "SubagentError", "code": "UNAUTHORIZED"}
    model.assert_consumed()


async def test_a_sibling_is_not_a_live_descendant(tmp_path: Path) -> None:
    """A child interrupting its running sibling is refused with `not a live descendant`; the sibling runs on."""
    first_phase = scripted(
        {
            "main": {"steps": [{"toolCalls": [_background("Second")]}, {"text": "SECOND_STARTED"}], "on": _NOTED},
            "Second": {"steps": [{"hold": "second", "text": "working"}]},
        }
    )
    model = PhasedModel(first_phase)
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Start the second helper."))
        [started] = result_texts(list(parent.session.events))
        sibling_id = started.removeprefix("started subagent ")
        async with asyncio.timeout(HANG_GUARD_S):
            await first_phase.wait_held("second")
            model.next_phase(
                scripted(
                    {
                        "main": {
                            "steps": [{"toolCalls": [_background("First")]}, {"text": "FIRST_STARTED"}],
                            "on": _NOTED,
                        },
                        "First": {"steps": [{"toolCalls": [_interrupt(sibling_id)]}, {"text": "FIRST_DONE"}]},
                    }
                )
            )
            await parent.turn_result(await parent.send("Start the first helper."))
            [_, started_first] = result_texts(list(parent.session.events))
            first_id = started_first.removeprefix("started subagent ")
            first = rt.agents.get(first_id)
            if first is not None:
                await first.wait_idle()
            await rt.subagents.settled()
            _, first_events = await stored(rt, first_id)
            sibling = rt.agents.get(sibling_id)
            sibling_status = sibling.status if sibling is not None else None
        [data] = tool_results(first_events)
    assert data["message"]["content"][0]["isError"] is True
    assert "not a live descendant" in result_text_of(data)
    assert data["error"] == {"name": "SubagentError", "code": "UNAUTHORIZED"}
    assert sibling_status == "running"


async def test_interrupting_an_absent_agent_is_accepted(tmp_path: Path) -> None:
    """An id no live agent holds is an accepted no-op: `interrupt requested for agent <id>`."""
    model = scripted({"main": {"steps": [{"toolCalls": [_interrupt("no-such-agent")]}, {"text": "DONE"}]}})
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Interrupt nobody."))
        [data] = tool_results(list(parent.session.events))
    assert data["message"]["content"][0]["isError"] is False
    assert result_text_of(data) == "interrupt requested for agent no-such-agent"
    assert data["message"]["content"][0]["output"] == {"accepted": True}
    model.assert_consumed()
