"""Batches of events for the harness's driver to append: whole turns as an agent of the harness writes them.

Layer: tests (interop). A batch is a list of `{type, data, surfaceOp?}` the driver appends to a live
harness session before one flush, so every batch is one durable write (one zstd frame). The
harness packs each run of three or more deltas of one block written in one batch into a packed row,
so `chunk_batches` streams its deltas in one batch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["assistant_calls", "assistant_message", "chunk_batches", "descriptor", "harness_turn", "user_message"]

Batch = list[dict[str, Any]]


def user_message(message_id: str, text: str, kind: str = "user") -> dict[str, Any]:
    """A `user/message` append."""
    data = {"id": message_id, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": kind}}
    return {"type": "user/message", "data": data, "surfaceOp": "append"}


def assistant_message(turn: int, step: int, message_id: str, text: str, **extra: Any) -> dict[str, Any]:
    """An `assistant/message` append, with the harness's disjoint usage."""
    message = {
        "id": message_id,
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"},
    }
    usage = {"inputTokens": 11, "outputTokens": 3, "cacheReadTokens": 128}
    return {
        "type": "assistant/message",
        "data": {"turn": turn, "step": step, "message": message, "usage": usage, **extra},
        "surfaceOp": "append",
    }


def assistant_calls(turn: int, step: int, message_id: str, call_ids: list[str]) -> dict[str, Any]:
    """An `assistant/message` append asking for one tool call per id (`ls`, no arguments)."""
    calls = [{"type": "tool-call", "id": call_id, "name": "ls", "arguments": "{}"} for call_id in call_ids]
    message = {
        "id": message_id,
        "role": "assistant",
        "content": calls,
        "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"},
    }
    return {
        "type": "assistant/message",
        "data": {"turn": turn, "step": step, "message": message},
        "surfaceOp": "append",
    }


def descriptor(mode: str, label: str | None) -> dict[str, Any]:
    """A `subagent/descriptor` append (version 2)."""
    data: dict[str, Any] = {"version": 2, "mode": mode, "provider": "spawn"}
    if label is not None:
        data["label"] = label
    return {"type": "subagent/descriptor", "data": data}


def harness_turn(turn: int, prompt: str, answer: str) -> list[Batch]:
    """One closed turn without streamed chunks: two batches (the prompt, then the answer and the end)."""
    return [
        [
            {"type": "turn/start", "data": {"turn": turn}},
            {"type": "step/start", "data": {"turn": turn, "step": 1}},
            user_message(f"u{turn}", prompt),
        ],
        [
            assistant_message(turn, 1, f"a{turn}", answer),
            {"type": "step/end", "data": {"turn": turn, "step": 1}},
            {"type": "turn/end", "data": {"turn": turn, "reason": {"kind": "completed"}}},
        ],
    ]


def chunk_batches(turn: int, deltas: list[str], *, prompt: str = "Say hello.", closed: bool = True) -> list[Batch]:
    """One turn whose answer is streamed as `assistant/chunk` deltas in one batch (packed by the harness).

    With `closed=False` the turn stops after the streamed deltas: no message, no `step/end`, no
    `turn/end` (a process that died mid-answer).
    """
    text = "".join(deltas)

    def chunk(body: dict[str, Any]) -> dict[str, Any]:
        return {"type": "assistant/chunk", "data": {"turn": turn, "step": 1, "chunk": body}}

    start = [
        {"type": "turn/start", "data": {"turn": turn}},
        {"type": "step/start", "data": {"turn": turn, "step": 1}},
        user_message(f"u{turn}", prompt),
    ]
    stream = [
        chunk({"type": "block-start", "index": 0, "blockType": "text"}),
        *(chunk({"type": "text-delta", "index": 0, "text": piece}) for piece in deltas),
    ]
    if not closed:
        return [start, stream]
    end = [
        chunk({"type": "block-end", "index": 0, "block": {"type": "text", "text": text}}),
        chunk({"type": "usage", "usage": {"inputTokens": 5, "outputTokens": len(deltas)}}),
        chunk({"type": "finish", "reason": {"kind": "stop"}}),
        assistant_message(turn, 1, f"a{turn}", text),
        {"type": "step/end", "data": {"turn": turn, "step": 1}},
        {"type": "turn/end", "data": {"turn": turn, "reason": {"kind": "completed"}}},
    ]
    return [start, stream, end]
