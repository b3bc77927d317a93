"""`send_message` through a real agent loop: delivery to a settled child, and the refusals the model sees.

Every test runs a real `Runtime` with the scripted model. Ids a later step must name are either
resolved by the script (`${child:<label>}`) or handed to the next phase of a `PhasedModel`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.agent.helpers import open_runtime
from tests.tools.helpers import PhasedModel, result_text_of, result_texts, scripted, stored, tool_results

_NOTED = [{"match": {"source": "subagent-settled"}, "text": "NOTED"}]


def _send(subagent_id: str, message: str) -> dict[str, Any]:
    return {"name": "send_message", "arguments": {"subagent_id": subagent_id, "message": message}}


def _user_messages(events: list[Any]) -> list[Any]:
    """The `user/message` data, the per-turn context messages left out."""
    return [e.data for e in events if e.type == "user/message" and e.data["source"]["kind"] != "plugin"]


async def test_send_message_queues_the_next_turn_of_a_settled_child(tmp_path: Path) -> None:
    """A settled child gets the message as its next turn, from a coordinator relay naming the caller."""
    model = scripted(
        {
            "main": {
                "steps": [
                    {
                        "match": {"lastUser": "Start a helper."},
                        "toolCalls": [
                            {
                                "name": "agent",
                                "arguments": {
                                    "description": "Draft outline",
                                    "prompt": "Outline the essay.",
                                    "run_in_background": True,
                                },
                            }
                        ],
                    },
                    {"text": "STARTED"},
                    {
                        "match": {"lastUser": "Ask for more."},
                        "toolCalls": [_send("${child:Draft outline}", "Add a conclusion.")],
                    },
                    {"text": "SENT"},
                ],
                "on": _NOTED,
            },
            "Draft outline": {
                "steps": [{"text": "OUTLINE_OK"}, {"match": {"lastUser": "Add a conclusion."}, "text": "CONCLUSION_OK"}]
            },
        }
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Start a helper."))
        await rt.settle()
        [started] = result_texts(list(parent.session.events))
        child_id = started.removeprefix("started subagent ")
        assert rt.agents.get(child_id) is None  # settled: only storage holds it now
        result = await parent.turn_result(await parent.send("Ask for more."))
        await rt.settle()
        [_, sent] = tool_results(list(parent.session.events))
        _, child_events = await stored(rt, child_id)
    assert result.output == "SENT"
    assert result_text_of(sent) == f"message queued as the next turn for subagent {child_id}"
    assert sent["message"]["content"][0]["isError"] is False
    assert set(sent["message"]["content"][0]["output"]) == {"messageId"}
    relayed = _user_messages(child_events)[-1]
    assert relayed["content"] == [{"type": "text", "text": "Add a conclusion."}]
    assert relayed["source"] == {"kind": "coordinator", "form": "relay", "senderSessionId": parent.id}
    assert [e.data["message"]["content"] for e in child_events if e.type == "assistant/message"][-1] == [
        {"type": "text", "text": "CONCLUSION_OK"}
    ]
    model.assert_consumed()


async def test_send_message_refuses_strangers_unknown_ids_and_one_shot_children(tmp_path: Path) -> None:
    """A stranger, an unknown id and a one-shot child each give an errored result, and nothing is delivered."""
    model = PhasedModel(
        scripted(
            {
                "main": {
                    "steps": [
                        {
                            "toolCalls": [
                                {"name": "agent", "arguments": {"description": "Quick look", "prompt": "Look."}},
                                {
                                    "name": "agent",
                                    "arguments": {
                                        "description": "Draft outline",
                                        "prompt": "Outline.",
                                        "run_in_background": True,
                                    },
                                },
                            ]
                        },
                        {"text": "BOTH_STARTED"},
                    ],
                    "on": _NOTED,
                },
                "Quick look": {"steps": [{"text": "LOOKED"}]},
                "Draft outline": {"steps": [{"text": "OUTLINE_OK"}]},
            }
        )
    )
    async with open_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Delegate twice."))
        await rt.settle()
        one_shot, background = tool_results(list(parent.session.events))
        one_shot_id = one_shot["message"]["content"][0]["output"]["childId"]
        child_id = background["message"]["content"][0]["output"]["childId"]
        model.next_phase(
            scripted(
                {
                    "main": {
                        "steps": [
                            {
                                "match": {"lastUser": "Message them."},
                                "toolCalls": [_send(one_shot_id, "More."), _send("no-such-child", "More.")],
                            },
                            {"text": "PARENT_DONE"},
                            {
                                "match": {"lastUser": "Message a stranger's child."},
                                "toolCalls": [_send(child_id, "More.")],
                            },
                            {"text": "STRANGER_DONE"},
                        ]
                    }
                }
            )
        )
        await parent.turn_result(await parent.send("Message them."))
        stranger = await rt.create_agent()
        await stranger.turn_result(await stranger.send("Message a stranger's child."))
        await rt.settle()
        _, _, to_one_shot, to_unknown = tool_results(list(parent.session.events))
        [to_strangers_child] = tool_results(list(stranger.session.events))
        _, child_events = await stored(rt, child_id)
        _, one_shot_events = await stored(rt, one_shot_id)
    for data in (to_one_shot, to_unknown, to_strangers_child):
        assert data["message"]["content"][0]["isError"] is True
        assert data["error"]["name"] == "SubagentError"
    assert "no supported continuation state" in result_text_of(to_one_shot)
    assert to_one_shot["error"]["code"] == "NOT_RESUMABLE"
    assert "unavailable" in result_text_of(to_unknown)
    assert to_unknown["error"]["code"] == "NOT_RESUMABLE"
    assert "another parent session" in result_text_of(to_strangers_child)
    assert to_strangers_child["error"]["code"] == "UNAUTHORIZED"
    assert len(_user_messages(child_events)) == 1
    assert len(_user_messages(one_shot_events)) == 1
    model.assert_consumed()
