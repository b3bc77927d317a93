"""A fast acceptance test for stored event records (the read path's common case).

Layer: session. `check_records` validates every record of every cold read, so its per-record cost
decides how close a full read comes to the machine limit (benchmark P5). This module answers one
question quickly: "is this record certainly valid?". It accepts only records the full rules in
`dsh.session.events` accept (a property test pins that), with every check inlined; anything
unusual — a foreign type, a replace, an aborted turn, a defect — answers "not certain" and the
caller runs the full checks, which produce the exact message. It never decides that a record is
invalid on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dsh.json import SAFE_INT_MAX
from dsh.session.events import EVENT_KEYS

__all__ = ["FAST_LOG_ONLY", "FAST_SURFACE_APPEND", "FAST_UNSURE", "fast_check"]

FAST_UNSURE: Final = 0
FAST_LOG_ONLY: Final = 1
FAST_SURFACE_APPEND: Final = 2

_KEYS: Final = frozenset(EVENT_KEYS)
_BASE_KEYS: Final = frozenset({"type", "seq", "time", "data"})
_SURFACE_KEYS: Final = frozenset({"type", "seq", "time", "data", "surfaceOp"})
_MAX: Final = SAFE_INT_MAX
_NESTED_REASONS: Final = frozenset({"aborted", "error"})


def _frame(message: Any, role: str) -> bool:
    if type(message) is not dict:
        return False
    mid = message.get("id")
    if type(mid) is not str or not mid or message.get("role") != role:
        return False
    content = message.get("content")
    if type(content) is not list:
        return False
    for block in content:
        if type(block) is not dict:
            return False
        kind = block.get("type")
        if type(kind) is not str or not kind:
            return False
    source = message.get("source")
    if type(source) is not dict:
        return False
    kind = source.get("kind")
    return type(kind) is str and bool(kind)


def _turn_step(data: Any) -> bool:
    if type(data) is not dict:
        return False
    turn = data.get("turn")
    step = data.get("step")
    return type(turn) is int and type(step) is int and 0 <= turn <= _MAX and 0 <= step <= _MAX


def _turn_start(data: Any) -> bool:
    if type(data) is not dict:
        return False
    turn = data.get("turn")
    return type(turn) is int and 0 <= turn <= _MAX


def _turn_end(data: Any) -> bool:
    if not _turn_start(data):
        return False
    reason = data.get("reason")
    if type(reason) is not dict:
        return False
    kind = reason.get("kind")
    # Aborted and error reasons carry nested shapes: the full rules judge those.
    return type(kind) is str and bool(kind) and kind not in _NESTED_REASONS


def _chunk(data: Any) -> bool:
    if not _turn_step(data):
        return False
    chunk = data.get("chunk")
    if type(chunk) is not dict:
        return False
    kind = chunk.get("type")
    return type(kind) is str and bool(kind)


def _user_message(data: Any) -> bool:
    return _frame(data, "user")


def _assistant_message(data: Any) -> bool:
    if not _turn_step(data):
        return False
    message = data.get("message")
    if not _frame(message, "assistant"):
        return False
    source = message["source"]
    if source["kind"] != "model" or type(source.get("provider")) is not str or type(source.get("model")) is not str:
        return False
    if "usage" in data and type(data["usage"]) is not dict:
        return False
    return "interrupted" not in data or data["interrupted"] is True


def _tool_call(data: Any) -> bool:
    if not _turn_step(data):
        return False
    call_id = data.get("callId")
    return (
        type(call_id) is str and bool(call_id) and type(data.get("name")) is str and type(data.get("arguments")) is str
    )


def _tool_result(data: Any) -> bool:
    if not _turn_step(data):
        return False
    message = data.get("message")
    if not _frame(message, "user"):
        return False
    source = message["source"]
    call_id = source.get("callId")
    if source["kind"] != "tool" or type(call_id) is not str or not call_id:
        return False
    content = message["content"]
    if len(content) != 1:
        return False
    block = content[0]
    if block["type"] != "tool-result" or block.get("toolCallId") != call_id or type(block.get("content")) is not list:
        return False
    if "isError" in block and type(block["isError"]) is not bool:
        return False
    if "error" in data:
        error = data["error"]
        if type(error) is not dict or type(error.get("name")) is not str or type(error.get("code")) is not str:
            return False
    return True


def _request_context(data: Any) -> bool:
    if type(data) is not dict or type(data.get("provider")) is not str or type(data.get("model")) is not str:
        return False
    if "contextWindow" in data:
        window = data["contextWindow"]
        return type(window) is int and 0 <= window <= _MAX
    return True


def _object(data: Any) -> bool:
    return type(data) is dict


def _anything(data: Any) -> bool:
    return True


_LOG_ONLY: Final[dict[str, Callable[[Any], bool]]] = {
    "turn/start": _turn_start,
    "turn/end": _turn_end,
    "step/start": _turn_step,
    "step/end": _turn_step,
    "assistant/chunk": _chunk,
    "tool/call": _tool_call,
    "request/context": _request_context,
    "session/end-seed": _object,
    "session/title": _anything,
    "subagent/descriptor": _anything,
}
_SURFACE: Final[dict[str, Callable[[Any], bool]]] = {
    "user/message": _user_message,
    "assistant/message": _assistant_message,
    "tool/result": _tool_result,
}


def fast_check(record: Any, index: int) -> int:
    """`FAST_LOG_ONLY` / `FAST_SURFACE_APPEND` when `record` is certainly a valid event at `index`
    (contiguous seq included), else `FAST_UNSURE`."""
    if type(record) is not dict:
        return FAST_UNSURE
    keys = record.keys()
    kind = record.get("type")
    seq = record.get("seq")
    time = record.get("time")
    if type(seq) is not int or seq != index or type(time) is not int or not -_MAX <= time <= _MAX:
        return FAST_UNSURE
    check = _LOG_ONLY.get(kind)  # type: ignore[arg-type]
    if check is not None:
        if keys != _BASE_KEYS:
            return FAST_UNSURE
        return FAST_LOG_ONLY if check(record["data"]) else FAST_UNSURE
    check = _SURFACE.get(kind)  # type: ignore[arg-type]
    if check is None or keys != _SURFACE_KEYS or record["surfaceOp"] != "append":
        return FAST_UNSURE
    return FAST_SURFACE_APPEND if check(record["data"]) else FAST_UNSURE
