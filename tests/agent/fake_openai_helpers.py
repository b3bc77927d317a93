"""Helpers of the OpenAI-compatible client tests: message frames, requests, clients and collectors.

Plain functions; the fake server itself comes from `dsh.testing.fake_openai` and is started by a
module-scoped fixture in the test module (one server per module, reset between tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsh.abort import AbortSignal
from dsh.agent.model import BlockEnd, ModelChunk, ModelRequest, RequestMeta, TextDelta
from dsh.agent.models import OpenAICompatibleClient, resolve_model_settings
from dsh.config import ModelConfig
from dsh.testing.fake_openai import FakeOpenAIServer

__all__ = [
    "KEY",
    "assistant",
    "client_for",
    "collect",
    "final_blocks",
    "request",
    "streamed_text",
    "tool_result",
    "user",
]

KEY = "sk-test-0123456789abcdef"
"""The API key every test client sends; tests check it never leaks."""


def user(text: str, *, message_id: str = "u1") -> dict[str, Any]:
    """A user message frame."""
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def assistant(*blocks: dict[str, Any], message_id: str = "a1") -> dict[str, Any]:
    """An assistant message frame holding `blocks`."""
    source = {"kind": "model", "provider": "openai-compatible", "model": "m"}
    return {"id": message_id, "role": "assistant", "content": list(blocks), "source": source}


def tool_result(call_id: str, text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A tool-result message frame answering `call_id`."""
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
    system: str | None = "You are terse.",
    tools: Sequence[dict[str, Any]] = (),
    model: str = "fake-chat",
    max_tokens: int | None = None,
) -> ModelRequest:
    """A model request over `messages` (default: one user message)."""
    return ModelRequest(
        model=model,
        system=system,
        messages=list(messages) or [user("hi")],
        tools=list(tools),
        meta=RequestMeta("s-main", "main", 1, 1),
        max_tokens=max_tokens,
    )


def client_for(server: FakeOpenAIServer, **overrides: Any) -> OpenAICompatibleClient:
    """A client for the fake server, sending `KEY`; `overrides` go to `resolve_model_settings`."""
    config = ModelConfig(base_url=server.base_url, api_key=KEY)
    return OpenAICompatibleClient(resolve_model_settings(config, **overrides))


async def collect(
    client: OpenAICompatibleClient, model_request: ModelRequest, signal: AbortSignal | None = None
) -> list[ModelChunk]:
    """Every chunk of one streamed request."""
    return [chunk async for chunk in client.stream(model_request, signal=signal or AbortSignal.none())]


def streamed_text(chunks: Sequence[ModelChunk]) -> str:
    """The concatenated text deltas."""
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TextDelta))


def final_blocks(chunks: Sequence[ModelChunk]) -> list[dict[str, Any]]:
    """The final content blocks (`BlockEnd`), in block-index order."""
    ends = sorted((c for c in chunks if isinstance(c, BlockEnd)), key=lambda c: c.index)
    return [dict(end.block) for end in ends]
