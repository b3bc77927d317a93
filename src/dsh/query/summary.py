"""One-line summaries of session events, for `dsh run --json` and the push stream.

Layer: query (a read-side presentation of stored facts; it never carries full content). A summary
is `{sessionId, seq, type, time, turn?, step?, summary?}` where `summary` is a text preview of at
most 200 characters for messages, `{name}` for `tool/call`, `{isError}` for `tool/result` and
`{reason}` for `turn/end`. Chunk events are not summarised (callers skip them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dsh.session.events import SessionEvent

__all__ = ["PREVIEW_CHARS", "event_summary", "is_summarised"]

PREVIEW_CHARS: Final = 200
"""The longest text preview a summary carries."""


def is_summarised(event: SessionEvent) -> bool:
    """False for the events a summary stream leaves out (streamed chunks)."""
    return event.type != "assistant/chunk"


def event_summary(session_id: str, event: SessionEvent) -> dict[str, Any]:
    """The summary of one event (see the module docs)."""
    out: dict[str, Any] = {"sessionId": session_id, "seq": event.seq, "type": event.type, "time": event.time}
    data = event.data
    if not isinstance(data, Mapping):
        return out
    for key in ("turn", "step"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    summary = _summary(event.type, data)
    if summary is not None:
        out["summary"] = summary
    return out


def _summary(kind: str, data: Mapping[str, Any]) -> object:
    if kind == "user/message":
        return _preview(data.get("content"))
    if kind == "assistant/message":
        message = data.get("message")
        return _preview(message.get("content")) if isinstance(message, Mapping) else None
    if kind == "tool/call":
        return {"name": data.get("name")}
    if kind == "tool/result":
        message = data.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        block = content[0] if isinstance(content, Sequence) and content and isinstance(content[0], Mapping) else {}
        return {"isError": bool(block.get("isError", False))}
    if kind == "turn/end":
        return {"reason": data.get("reason")}
    return None


def _preview(content: object) -> str | None:
    if not isinstance(content, Sequence) or isinstance(content, str):
        return None
    text = "".join(
        block["text"]
        for block in content
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
    )
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
