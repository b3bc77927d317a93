"""Crash repair: the synthetic events that close a turn a crashed writer left open.

Layer: session. `interrupted_turn_closers` is pure: it reads a log and returns the events that
balance its open tail turn (`[]` for a balanced log). A crashed turn is closed, never truncated.
Who applies the closers, and only to sessions that are not live, is the persistence coordinator's
business (docs/architecture.md#crash-repair). The three tool-result texts are model-visible and frozen by a test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from dsh.json import FrozenDict, FrozenList, JsonValue
from dsh.session.events import SessionEvent, make_event

__all__ = [
    "TOOL_AWAITING_APPROVAL_TEXT",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "interrupted_turn_closers",
    "last_activity_time",
]

TOOL_NOT_STARTED_TEXT: Final = (
    "This tool call was interrupted before it was recorded as started; it is fine to retry it if it is still needed."
)
TOOL_AWAITING_APPROVAL_TEXT: Final = (
    "This tool call was waiting for the user's approval when the session stopped, so it was not run; "
    "call it again if it is still needed."
)
TOOL_OUTCOME_UNKNOWN_TEXT: Final = (
    "This tool call was recorded as started but no result was durably recorded, so its outcome is unknown: "
    "retry only if the operation is read-only or idempotent; otherwise first verify the external state "
    "or ask the user, and never retry blindly."
)


def _open_turn_start(events: Sequence[Mapping[str, Any]], type_at: Callable[[int], str] | None) -> int | None:
    """Index of the `turn/start` of the open tail turn, or None when the log is balanced."""
    for index in range(len(events) - 1, -1, -1):
        kind = type_at(index) if type_at is not None else events[index]["type"]
        if kind == "turn/end":
            return None
        if kind == "turn/start":
            return index
    return None


def interrupted_turn_closers(
    events: Sequence[Mapping[str, Any]], *, type_at: Callable[[int], str] | None = None
) -> list[SessionEvent]:
    """Return the closers for an open tail turn, seqs continuing the log, times never invented.

    Emits one `approval/decided {outcome: "cancelled"}` per approval still undecided, one
    `tool/result` per pending tool call (registration order; a call whose approval was undecided did
    not run), then `step/end` if a step is open, then `turn/end {reason: {kind: "interrupted"}}`.
    Works on frozen events and on the raw records of the read pipeline alike; `type_at` (each event's
    type by position, when the caller has them) spares reading the events of a long tail that holds
    no turn.
    """
    start = _open_turn_start(events, type_at)
    if start is None:
        return []
    turn: int = events[start]["data"]["turn"]
    open_step: int | None = None
    pending: dict[str, list[Any]] = {}  # callId -> [step, tool/call seq or None]
    asked: dict[str, str | None] = {}  # approval id -> the callId it is about, while undecided
    for index in range(start + 1, len(events)):
        event = events[index]
        kind = event["type"]
        data = event["data"]
        if kind == "approval/asked":
            call = data.get("callId") if isinstance(data, Mapping) else None
            if isinstance(data, Mapping) and isinstance(data.get("id"), str):
                asked[data["id"]] = call if isinstance(call, str) else None
            continue
        if kind == "approval/decided":
            if isinstance(data, Mapping):
                asked.pop(data.get("id"), None)  # type: ignore[arg-type]
            continue
        if kind == "step/start":
            open_step = data["step"]
        elif kind == "step/end":
            open_step = None
            pending.clear()
        elif kind == "assistant/message":
            for block in data["message"]["content"]:
                if isinstance(block, Mapping) and block.get("type") == "tool-call":
                    call_id = block.get("id")
                    if isinstance(call_id, str) and call_id:
                        pending[call_id] = [data["step"], None]
        elif kind == "tool/call":
            entry = pending.get(data["callId"])
            if entry is not None:
                entry[1] = event["seq"]
        elif kind == "tool/result":
            pending.pop(data["message"]["source"]["callId"], None)
    time: int = events[-1]["time"]
    seq = len(events)
    closers: list[SessionEvent] = []
    awaiting = {call for call in asked.values() if call is not None}
    for approval_id in asked:
        decided = FrozenDict({"id": approval_id, "outcome": "cancelled"})
        closers.append(make_event("approval/decided", seq, time, decided))
        seq += 1
    for call_id, (step, call_seq) in pending.items():
        message_id = f"interrupted-tool-result-{call_id}-{seq}"
        if call_id in awaiting:
            # The body runs only after the decision, so an undecided call never started.
            error = FrozenDict({"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"})
            text, sources = TOOL_AWAITING_APPROVAL_TEXT, FrozenList([call_seq]) if call_seq is not None else None
        elif call_seq is None:
            error = FrozenDict({"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"})
            text, sources = TOOL_NOT_STARTED_TEXT, None
        else:
            error = FrozenDict({"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"})
            text, sources = TOOL_OUTCOME_UNKNOWN_TEXT, FrozenList([call_seq])
        message = _tool_result_message(message_id, call_id, text)
        data_out = FrozenDict({"turn": turn, "step": step, "message": message, "error": error})
        closers.append(make_event("tool/result", seq, time, data_out, source_event_seqs=sources, surface_op="append"))
        seq += 1
    if open_step is not None:
        closers.append(make_event("step/end", seq, time, FrozenDict({"turn": turn, "step": open_step})))
        seq += 1
    reason = FrozenDict({"kind": "interrupted"})
    closers.append(make_event("turn/end", seq, time, FrozenDict({"turn": turn, "reason": reason})))
    return closers


def _tool_result_message(message_id: str, call_id: str, text: str) -> FrozenDict:
    block: JsonValue = FrozenDict(
        {
            "type": "tool-result",
            "toolCallId": call_id,
            "isError": True,
            "content": FrozenList([FrozenDict({"type": "text", "text": text})]),
        }
    )
    return FrozenDict(
        {
            "id": message_id,
            "role": "user",
            "source": FrozenDict({"kind": "tool", "callId": call_id}),
            "content": FrozenList([block]),
        }
    )


def last_activity_time(events: Sequence[Mapping[str, Any]]) -> int | None:
    """Time of the last event that is not a `session/end-seed` marker."""
    for index in range(len(events) - 1, -1, -1):
        if events[index]["type"] != "session/end-seed":
            return events[index]["time"]  # type: ignore[no-any-return]
    return None
