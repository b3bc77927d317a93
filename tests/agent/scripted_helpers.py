"""Helpers of the scripted-client tests: message frames, requests and a chunk collector.

Plain functions returning fresh plain `dict`s in the shapes the agent loop hands a model client, so
each test states its conversation in a few lines.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dsh.abort import AbortSignal
from dsh.agent.model import ModelChunk, ModelRequest, RequestMeta, TextDelta
from dsh.agent.models.scripted import ScriptedModelClient

__all__ = [
    "agent_call",
    "assistant_calls",
    "collect",
    "notice",
    "request",
    "script",
    "streamed_text",
    "tool_result",
    "user",
]


def user(text: str, *, kind: str = "user", message_id: str = "u1") -> dict[str, Any]:
    """A user message whose source kind is `kind` (`user`, `coordinator`, `subagent-settled`, ...)."""
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": kind}}


def notice(text: str = "Subagent finished.") -> dict[str, Any]:
    """A settlement notice, as a parent receives it when a subagent settles."""
    message = user(text, kind="subagent-settled", message_id="n1")
    message["source"] |= {"form": "notice", "summary": text, "senderSessionId": "child"}
    return message


def assistant_calls(*calls: tuple[str, str, str]) -> dict[str, Any]:
    """An assistant message holding tool calls given as `(id, name, raw arguments)`."""
    return {
        "id": "a1",
        "role": "assistant",
        "content": [{"type": "tool-call", "id": i, "name": n, "arguments": a} for i, n, a in calls],
        "source": {"kind": "model", "provider": "scripted", "model": "m"},
    }


def agent_call(call_id: str, description: str) -> tuple[str, str, str]:
    """An `agent` tool call (as `assistant_calls` takes it) that starts a background child."""
    arguments = {"description": description, "prompt": "Do it.", "run_in_background": True}
    return (call_id, "agent", json.dumps(arguments))


def tool_result(call_id: str, text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A tool-result message answering `call_id`."""
    return {
        "id": f"r-{call_id}",
        "role": "user",
        "source": {"kind": "tool", "callId": call_id},
        "content": [
            {
                "type": "tool-result",
                "toolCallId": call_id,
                "content": [{"type": "text", "text": text}],
                "isError": is_error,
            }
        ],
    }


def request(
    *messages: dict[str, Any],
    agent_key: str = "main",
    session_id: str = "s-main",
    turn: int = 1,
    tools: Sequence[str] = (),
) -> ModelRequest:
    """A model request carrying `messages` (oldest first) for the track `agent_key`."""
    return ModelRequest(
        model="m",
        system=None,
        messages=list(messages),
        tools=[{"name": name, "description": name, "parameters": {"type": "object"}} for name in tools],
        meta=RequestMeta(session_id=session_id, agent_key=agent_key, turn=turn, step=1),
    )


def script(agents: dict[str, Any], *, model: str = "scripted-test") -> ScriptedModelClient:
    """A client over a version-1 script with the given tracks."""
    return ScriptedModelClient.from_dict({"version": 1, "model": model, "agents": agents})


async def collect(
    client: ScriptedModelClient, req: ModelRequest, signal: AbortSignal | None = None
) -> list[ModelChunk]:
    """Every chunk of one streamed answer."""
    return [chunk async for chunk in client.stream(req, signal=signal or AbortSignal.none())]


def streamed_text(chunks: Sequence[ModelChunk]) -> str:
    """The answer text the text deltas spell out."""
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TextDelta))
