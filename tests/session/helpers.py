"""Shared helpers of the session-layer tests: builders for well-formed session events.

Plain functions (not fixtures) so tests can use them in parametrisation and in Hypothesis strategies.
Each returns fresh plain `dict`s, the way a caller would hand data to `Session.append` or a seed.
The `store` fixture these tests share lives in `tests/session/conftest.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsh.session import Session


def user_message(message_id: str = "u1", text: str = "hello") -> dict[str, Any]:
    """A `user/message` data payload (the message is the data)."""
    return {
        "id": message_id,
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "user"},
    }


def assistant_message(
    turn: int,
    step: int,
    *,
    message_id: str = "a1",
    text: str = "ok",
    tool_calls: Sequence[str] = (),
) -> dict[str, Any]:
    """An `assistant/message` data payload; each id in `tool_calls` becomes a `tool-call` block."""
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    content.extend({"type": "tool-call", "id": call_id, "name": "probe", "arguments": "{}"} for call_id in tool_calls)
    return {
        "turn": turn,
        "step": step,
        "message": {
            "id": message_id,
            "role": "assistant",
            "content": content,
            "source": {"kind": "model", "provider": "scripted", "model": "m1"},
        },
    }


def tool_call(turn: int, step: int, call_id: str) -> dict[str, Any]:
    """A `tool/call` data payload."""
    return {"turn": turn, "step": step, "callId": call_id, "name": "probe", "arguments": "{}"}


def tool_result(
    turn: int,
    step: int,
    call_id: str,
    *,
    message_id: str | None = None,
    text: str = "done",
    is_error: bool | None = None,
) -> dict[str, Any]:
    """A `tool/result` data payload answering `call_id`."""
    block: dict[str, Any] = {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}
    if is_error is not None:
        block["isError"] = is_error
    return {
        "turn": turn,
        "step": step,
        "message": {
            "id": message_id or f"r-{call_id}",
            "role": "user",
            "content": [block],
            "source": {"kind": "tool", "callId": call_id},
        },
    }


def turn_end(turn: int, kind: str = "completed") -> dict[str, Any]:
    """A `turn/end` data payload."""
    return {"turn": turn, "reason": {"kind": kind}}


def record(seq: int, type: str, data: object, time: int = 1_000, **extra: object) -> dict[str, Any]:
    """A raw stored-form event record (for seeds): canonical keys plus any `extra` envelope keys."""
    out: dict[str, Any] = {"type": type, "seq": seq, "time": time, "data": data}
    out.update(extra)
    return out


def closed_turn_records(start_seq: int, turn: int) -> list[dict[str, Any]]:
    """Raw records of one closed turn: `turn/start`, a user message, an assistant reply, `turn/end`."""
    return [
        record(start_seq, "turn/start", {"turn": turn}),
        record(start_seq + 1, "user/message", user_message(f"u{turn}"), surfaceOp="append"),
        record(
            start_seq + 2, "assistant/message", assistant_message(turn, 1, message_id=f"a{turn}"), surfaceOp="append"
        ),
        record(start_seq + 3, "turn/end", turn_end(turn)),
    ]


def append_closed_turn(session: Session, turn: int) -> None:
    """Append one closed turn (4 events) to a session."""
    session.append("turn/start", {"turn": turn})
    session.append("user/message", user_message(f"u{turn}"))
    session.append("assistant/message", assistant_message(turn, 1, message_id=f"a{turn}"))
    session.append("turn/end", turn_end(turn))
