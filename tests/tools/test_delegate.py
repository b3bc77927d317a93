"""The delegation tool `agent` through a real agent loop: background and foreground children, depth, cancellation.

Every test runs a real `Runtime` (JSONL persistence on a temporary home) with the scripted model;
a child answers from the script track named by its label (the tool's `description`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dsh.session import Session
from tests.agent.helpers import HANG_GUARD_S, open_runtime
from tests.tools.helpers import result_text_of, result_texts, scripted, stored, tool_results

_NOTED = [{"match": {"source": "subagent-settled"}, "text": "NOTED"}]


def _agent_call(description: str, prompt: str, *, background: bool = False) -> dict[str, Any]:
    arguments: dict[str, Any] = {"description": description, "prompt": prompt}
    if background:
        arguments["run_in_background"] = True
    return {"toolCalls": [{"name": "agent", "arguments": arguments}]}


async def test_background_child_starts_under_the_caller_after_its_log_was_flushed(tmp_path: Path) -> None:
    """A background call answers `started subagent <id>`; the child names the caller and was created after a flush."""
    model = scripted(
        {
            "main": {
                "steps": [_agent_call("Draft outline", "Outline the essay.", background=True), {"text": "STARTED"}],
                "on": _NOTED,
            },
            "Draft outline": {"steps": [{"text": "OUTLINE_OK"}]},
        }
    )
    timeline: list[tuple[str, str, int]] = []
    async with open_runtime(tmp_path, model) as rt:

        async def flushed(session: Session) -> None:
            timeline.append(("flush", session.id, len(session.events)))

        rt.sessions.on_flush(flushed)
        rt.sessions.on_created(lambda session: timeline.append(("created", session.id, len(session.events))))
        parent = await rt.create_agent()
        result = await parent.turn_result(await parent.send("Start a helper."))
        await rt.settle()
        events = list(parent.session.events)
        [data] = tool_results(events)
        child_id = data["message"]["content"][0]["output"]["childId"]
        header, child_events = await stored(rt, child_id)
    assert result.output == "STARTED"
    assert result_text_of(data) == f"started subagent {child_id}"
    assert data["message"]["content"][0]["isError"] is False
    assert set(data["message"]["content"][0]["output"]) == {"childId", "messageId"}
    assert header.origin == "subagent"
    assert header.parent_session == parent.id
    assert header.delegation_depth == 1
    assert any(e.type == "assistant/message" for e in child_events)
    # The caller's log, through its `tool/call`, was flushed before the child session was published.
    call_seq = next(e.seq for e in events if e.type == "tool/call")
    created_at = timeline.index(next(entry for entry in timeline if entry[:2] == ("created", child_id)))
    assert any(kind == "flush" and sid == parent.id and count > call_seq for kind, sid, count in timeline[:created_at])
    model.assert_consumed()


async def test_foreground_child_answer_is_the_tool_result(tmp_path: Path) -> None:
    """Without `run_in_background` the call waits, and the child's final answer is the result the caller sees."""
    model = scripted(
        {
            "main": {"steps": [_agent_call("Quick look", "Look at the README."), {"text": "DONE"}]},
            "Quick look": {"steps": [{"text": "LOOKED_OK"}]},
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        result = await parent.turn_result(await parent.send("Delegate a look."))
        [data] = tool_results(list(parent.session.events))
        block = data["message"]["content"][0]
        child_id = block["output"]["childId"]
        header, _ = await stored(rt, child_id)
        assert rt.agents.get(child_id) is None
    assert result.output == "DONE"
    assert (block["isError"], result_text_of(data)) == (False, "LOOKED_OK")
    assert block["output"] == {
        "childId": child_id,
        "stopReason": "completed",
        "output": [{"type": "text", "text": "LOOKED_OK"}],
    }
    assert (header.origin, header.parent_session) == ("subagent", parent.id)
    model.assert_consumed()


async def test_foreground_child_without_an_answer_renders_no_output(tmp_path: Path) -> None:
    """A completed child that said nothing renders `(no output)`."""
    model = scripted(
        {
            "main": {"steps": [_agent_call("Silent look", "Say nothing."), {"text": "DONE"}]},
            "Silent look": {"steps": [{}]},
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Delegate silence."))
        texts = result_texts(list(parent.session.events))
    assert texts == ["(no output)"]
    model.assert_consumed()


async def test_foreground_child_that_fails_is_an_errored_result_with_its_partial_answer(tmp_path: Path) -> None:
    """A child that does not complete gives `Error: subagent <id> stopped before finishing (<reason>): <its error>`
    + partial text."""
    model = scripted(
        {
            "main": {"steps": [_agent_call("Flaky look", "Look."), {"text": "DONE"}]},
            "Flaky look": {
                "steps": [{"text": "half an answer", "error": {"code": "MODEL_UNAVAILABLE", "message": "down"}}]
            },
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Delegate a flaky look."))
        [data] = tool_results(list(parent.session.events))
    block = data["message"]["content"][0]
    assert block["isError"] is True
    text = result_text_of(data)
    assert text.startswith("Error: subagent ")
    first, _, rest = text.partition("\n")
    assert first.endswith(" stopped before finishing (error): down")
    assert rest == "half an answer"
    model.assert_consumed()


async def test_a_child_past_the_depth_cap_is_refused(tmp_path: Path) -> None:
    """A caller at depth 3 cannot delegate: `Error: subagent depth 4 exceeds maxDepth 3`, and no child is created."""
    model = scripted({"main": {"steps": [_agent_call("Too deep", "Go deeper."), {"text": "REFUSED"}]}})
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent(options=rt.agent_options(subagent_depth=3))
        await parent.turn_result(await parent.send("Delegate once more."))
        [data] = tool_results(list(parent.session.events))
        live = [session.id for session in rt.sessions.list()]
    assert result_text_of(data) == "Error: subagent depth 4 exceeds maxDepth 3"
    assert data["error"] == {"name": "SubagentDepthError", "code": "SUBAGENT_DEPTH_EXCEEDED"}
    assert live == [parent.id]
    model.assert_consumed()


async def test_cancelling_a_foreground_call_disposes_the_child(tmp_path: Path) -> None:
    """Cancelling the caller's turn while a foreground child works ends the call as cancelled and disposes the child."""
    model = scripted(
        {
            "main": {"steps": [_agent_call("Slow look", "Take your time.")]},
            "Slow look": {"steps": [{"hold": "slow", "text": "still looking"}]},
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        message_id = await parent.send("Delegate a slow look.")
        async with asyncio.timeout(HANG_GUARD_S):
            await model.wait_held("slow")
            [child_id] = [agent.id for agent in rt.agents.list() if agent.id != parent.id]
            parent.cancel("user")
            result = await parent.turn_result(message_id)
        assert rt.agents.get(child_id) is None
        _, child_events = await stored(rt, child_id)
        texts = result_texts(list(parent.session.events))
    assert result.stop_reason == "aborted"
    assert texts == ["Error: tool call was cancelled"]
    [end] = [e for e in child_events if e.type == "turn/end"]
    assert end.data["reason"]["kind"] == "aborted"
