"""A scripted parent drives background children through the model-facing tools.

Layer: subagent. The parent's script starts two background children with the `agent` tool, answers
their settlement notices with a standing `on` entry whatever order they arrive in, and reaches one
child again through `send_message` with the `${child:<label>}` placeholder.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.subagent.ops_helpers import (
    HANG_GUARD_S,
    LifecycleLog,
    ops_runtime,
    scripted,
    settle,
    stored_events,
    user_prompts,
    user_sources,
)

LABELS = ("Draft outline", "Check facts")


def _agent_call(label: str) -> dict[str, object]:
    return {"name": "agent", "arguments": {"description": label, "prompt": f"Do: {label}.", "run_in_background": True}}


@pytest.mark.parametrize("first", LABELS)
async def test_notices_in_either_order_are_answered_and_the_placeholder_names_the_child(
    tmp_path: Path, first: str
) -> None:
    """Both notices are answered by the standing entry in either order; `${child:Draft outline}` is that child's id."""
    client = scripted(
        {
            "main": {
                "steps": [
                    {"match": {"lastUser": "two helpers"}, "toolCalls": [_agent_call(label) for label in LABELS]},
                    {"text": "HELPERS_STARTED"},
                    {
                        "match": {"lastUser": "follow up"},
                        "toolCalls": [
                            {
                                "name": "send_message",
                                "arguments": {"subagent_id": "${child:Draft outline}", "message": "Add a conclusion."},
                            }
                        ],
                    },
                    {"match": {"lastToolResult": "message queued as the next turn"}, "text": "SENT"},
                ],
                "on": [{"match": {"source": "subagent-settled"}, "text": "NOTED"}],
            },
            "Draft outline": [{"hold": "Draft outline", "text": "OUTLINE_OK"}, {"text": "OUTLINE_V2_OK"}],
            "Check facts": [{"hold": "Check facts", "text": "FACTS_OK"}],
        }
    )
    async with ops_runtime(tmp_path, client) as rt:
        log = LifecycleLog(rt)
        started = await rt.run("start two helpers")
        parent = rt.agents.get(started.session_id)
        assert parent is not None
        assert started.output == "HELPERS_STARTED"
        rows = await rt.subagents.list_children(parent.id)
        ids = {row.label: row.id for row in rows}  # type: ignore[union-attr]
        second = LABELS[1] if first == LABELS[0] else LABELS[0]
        for label in (first, second):
            client.release(label)
            # The notice is queued before the child's end is emitted; the parent then answers it.
            await log.wait_end(ids[label])
            await asyncio.wait_for(parent.wait_idle(), HANG_GUARD_S)
        followed = await rt.run("follow up", parent.id)
        assert followed.output == "SENT"
        await settle(rt)
        client.assert_consumed()
        assert rt.sessions.get(ids["Draft outline"]) is None  # settled again after the follow-up
        outline = user_prompts(await stored_events(rt, ids["Draft outline"]))
    notices = [
        source["senderSessionId"]
        for source in user_sources(parent.session.events)
        if source["kind"] == "subagent-settled"
    ]
    assert notices == [ids[first], ids[second], ids["Draft outline"]]
    assert outline == ["Do: Draft outline.", "Add a conclusion."]
    # The follow-up went to the child named by the placeholder.
    results = [
        block["content"][0]["text"]
        for event in parent.session.events
        if event.type == "tool/result"
        for block in event.data["message"]["content"]
    ]
    assert results[-1] == f"message queued as the next turn for subagent {ids['Draft outline']}"
