"""The event envelope, the event vocabulary and its data-shape checks.

Layer: session. An event is a `SessionEvent`: a read-only mapping (`FrozenDict`) with typed
properties. The checks here are shared by every path that admits events — a live append, a
constructor seed, and the persistence read pipeline — so a log the core would refuse to write can
never be read back as valid, and vice versa. Checks return a problem text (or None) instead of
raising, so each caller raises its own error kind (`INVALID_EVENT`, `INVALID_SEED`,
`SESSION_CORRUPT`) with its own prefix, and the read path stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final, Literal, TypeAlias

from dsh.json import FrozenDict, FrozenList, JsonValue, is_safe_int

__all__ = [
    "EVENT_KEYS",
    "KNOWN_EVENT_TYPES",
    "LEGACY_EVENT_TYPES",
    "SHAPE_CHECKED_TYPES",
    "SURFACE_TYPES",
    "SessionEvent",
    "SurfaceOp",
    "SurfaceReplace",
    "data_problem",
    "envelope_problem",
    "legacy_problem",
    "make_event",
    "source_seqs_problem",
]

KNOWN_EVENT_TYPES: Final[frozenset[str]] = frozenset(
    {
        "agent-preset/selected",
        "agent/inbox/spliced",
        "approval/asked",
        "approval/decided",
        "approval/policy",
        "assistant/chunk",
        "assistant/message",
        "command/done",
        "command/run",
        "compaction/end",
        "compaction/prune",
        "compaction/start",
        "compaction/summary",
        "feedback/record",
        "goal/change",
        "hook/invoked",
        "hook/result",
        "llm/retry",
        "llm/retry-started",
        "permission/preset",
        "plan/mode",
        "request/context",
        "request/header",
        "sandbox/mode",
        "schedule/change",
        "session/end-seed",
        "session/title",
        "session/title-llm-request",
        "step/end",
        "step/start",
        "subagent/descriptor",
        "team/member",
        "team/message/delivered",
        "team/message/queued",
        "team/task",
        "todo/write",
        "tool-workflow/agent-end",
        "tool-workflow/agent-start",
        "tool-workflow/run-end",
        "tool-workflow/run-start",
        "tool/call",
        "tool/code-dispatch",
        "tool/code-dispatch-start",
        "tool/result",
        "turn/end",
        "turn/start",
        "user/message",
        "web/deepseek-search-llm-request",
    }
)
"""Every type this library writes plus the upstream harness's known types (a constant)."""

LEGACY_EVENT_TYPES: Final[frozenset[str]] = frozenset({"request/header-delta", "mode/set", "steering/message"})
"""Retired vocabulary, refused at append. On read, `steering/message` is migrated to a user message
(docs/storage-format.md#compatibility-with-the-typescript-harness); the other two stay refused."""

SURFACE_TYPES: Final[frozenset[str]] = frozenset({"user/message", "assistant/message", "tool/result"})
"""The surface-eligible types: they must carry `surfaceOp`; no other type may."""

EVENT_KEYS: Final = ("type", "seq", "time", "data", "ignorable", "sourceEventSeqs", "surfaceOp")
_EVENT_KEY_SET: Final = frozenset(EVENT_KEYS)


@dataclass(frozen=True, slots=True)
class SurfaceReplace:
    """A surface replace: shadows the current surface nodes from seq `start` through seq `end`."""

    start: int
    end: int

    def to_json(self) -> FrozenDict:
        """The stored form `{"op": "replace", "start": s, "end": e}`."""
        return FrozenDict({"op": "replace", "start": self.start, "end": self.end})


SurfaceOp: TypeAlias = Literal["append"] | SurfaceReplace


def _key_property(key: str, doc: str) -> Any:
    """A read-only property returning `self[key]` through `operator.itemgetter` (no Python frame)."""
    return property(itemgetter(key), doc=doc)


class SessionEvent(FrozenDict):
    """One committed event: a read-only mapping with typed accessors.

    Equality is semantic (mapping equality); restored events keep their stored key order, events this
    library builds use the canonical order `type, seq, time, data, ignorable, sourceEventSeqs, surfaceOp`.
    """

    __slots__ = ()

    # The envelope accessors are read on every event of every fold: each is one C-level lookup.
    type: str = _key_property("type", "The event type, e.g. `turn/start`.")
    seq: int = _key_property("seq", "The event's index in its log.")
    time: int = _key_property("time", "Epoch milliseconds.")
    data: JsonValue = _key_property("data", "The frozen payload.")

    @property
    def ignorable(self) -> bool:
        """True when a reader that does not know `type` may skip the event."""
        return self.get("ignorable") is True

    @property
    def source_event_seqs(self) -> FrozenList | None:
        """Earlier seqs this event cites (surface-eligible types only)."""
        return self.get("sourceEventSeqs")  # type: ignore[return-value]

    @property
    def surface_op(self) -> SurfaceOp | None:
        """`"append"`, a `SurfaceReplace`, or None for log-only events."""
        op = self.get("surfaceOp")
        if op is None:
            return None
        if op == "append":
            return "append"
        assert isinstance(op, dict)
        return SurfaceReplace(op["start"], op["end"])  # type: ignore[arg-type]


def make_event(
    type: str,
    seq: int,
    time: int,
    data: JsonValue,
    *,
    ignorable: bool = False,
    source_event_seqs: FrozenList | None = None,
    surface_op: JsonValue = None,
) -> SessionEvent:
    """Build an event in canonical key order from already-frozen parts."""
    fields: dict[str, JsonValue] = {"type": type, "seq": seq, "time": time, "data": data}
    if ignorable:
        fields["ignorable"] = True
    if source_event_seqs is not None:
        fields["sourceEventSeqs"] = source_event_seqs
    if surface_op is not None:
        fields["surfaceOp"] = surface_op
    return SessionEvent(fields)


# --------------------------------------------------------------------------------------------------
# Envelope


def envelope_problem(record: Mapping[str, Any]) -> str | None:
    """Check the top-level keys and their types; None when the envelope is valid."""
    for key in record:
        if key not in _EVENT_KEY_SET:
            return f"unknown envelope key {key!r}"
    kind = record.get("type")
    if type(kind) is not str or not kind:
        return "type must be a non-empty string"
    seq: Any = record.get("seq")
    if not (is_safe_int(seq) and seq >= 0):
        return f"seq must be a non-negative safe integer, got {_got(seq)}"
    if not is_safe_int(record.get("time")):
        return f"time must be a safe integer, got {_got(record.get('time'))}"
    if "data" not in record:
        return "data is required"
    if "ignorable" in record and record["ignorable"] is not True:
        return "ignorable may only be the literal true"
    surface = kind in SURFACE_TYPES
    if "surfaceOp" in record:
        if not surface:
            return f'session event "{kind}" is log-only and must not carry a surfaceOp'
        op = record["surfaceOp"]
        if op != "append" and not _is_replace(op):
            return 'surfaceOp must be "append" or {"op":"replace","start":s,"end":e}'
    if "sourceEventSeqs" in record:
        if not surface:
            return f'session event "{kind}" is log-only and must not carry sourceEventSeqs'
        problem = source_seqs_problem(kind, seq, record["sourceEventSeqs"])
        if problem is not None:
            return problem
    return None


def _is_replace(op: object) -> bool:
    return (
        isinstance(op, dict)
        and len(op) == 3
        and op.get("op") == "replace"
        and is_safe_int(op.get("start"))
        and is_safe_int(op.get("end"))
    )


def source_seqs_problem(kind: str, seq: int, seqs: object) -> str | None:
    """Check `sourceEventSeqs`: distinct safe seqs below `seq`, non-empty except on `assistant/message`."""
    if not isinstance(seqs, list):
        return "sourceEventSeqs must be an array of seqs"
    if not seqs and kind != "assistant/message":
        return f'sourceEventSeqs of "{kind}" must not be empty'
    seen: set[int] = set()
    for value in seqs:
        if not (is_safe_int(value) and 0 <= value < seq):
            return f"sourceEventSeqs entries must be earlier seqs (below {seq}), got {value!r}"
        if value in seen:
            return f"sourceEventSeqs entries must be distinct, {value} repeats"
        seen.add(value)
    return None


def legacy_problem(kind: str, data: object) -> str | None:
    """Name the retired vocabulary `kind`/`data` uses, or None (checked at append and on read)."""
    if kind in LEGACY_EVENT_TYPES:
        return f'event type "{kind}" belongs to a retired vocabulary'
    if kind == "request/header" and isinstance(data, dict) and data.get("reason") == "fallback":
        return 'event "request/header" with reason "fallback" belongs to a retired vocabulary'
    if kind in SURFACE_TYPES and isinstance(data, dict):
        message = data if kind == "user/message" else data.get("message")
        if isinstance(message, dict) and "id" not in message and "role" in message:
            return f'event "{kind}" carries a pre-identity message (no id), a retired shape'
    return None


# --------------------------------------------------------------------------------------------------
# Data shapes. Each checker returns a problem text or None; extra keys are tolerated.


def _got(value: object) -> str:
    """A short, safe description of a value a rule refused (numbers exactly, other values by kind)."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int:
        digits = str(value)
        shown = digits if len(digits) <= 40 else f"{digits[:20]}...({len(digits)} digits)"
        return shown if is_safe_int(value) else f"{shown}, outside the safe integer range \u00b1(2**53-1)"
    if type(value) is float:
        return repr(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def _int_field(data: Mapping[str, Any], key: str) -> str | None:
    value: Any = data.get(key)
    if not (is_safe_int(value) and value >= 0):
        if key not in data:
            return f"{key} is missing (it must be a non-negative safe integer)"
        return f"{key} must be a non-negative safe integer, got {_got(value)}"
    return None


def _turn_step(data: Mapping[str, Any]) -> str | None:
    return _int_field(data, "turn") or _int_field(data, "step")


def _shape(expected: str, data: object) -> str:
    """The problem of a payload that is not an object at all."""
    return f"data must be an object {expected}, got {_got(data)}"


def _is_obj(value: object) -> bool:
    return isinstance(value, dict)


def _nonempty_str(value: object) -> bool:
    return type(value) is str and bool(value)


def _frame_problem(message: Any, role: str) -> str | None:
    if not _is_obj(message):
        return "message must be an object"
    if not _nonempty_str(message.get("id")):
        return "message id must be a non-empty string"
    if message.get("role") != role:
        return f'message role must be "{role}"'
    content = message.get("content")
    if not isinstance(content, list):
        return "message content must be an array of blocks"
    for index, block in enumerate(content):
        if not (_is_obj(block) and _nonempty_str(block.get("type"))):
            return f"message content[{index}] must be a block with a type"
    source: Any = message.get("source")
    if not (_is_obj(source) and _nonempty_str(source.get("kind"))):
        return "message source must be an object with a non-empty kind"
    return None


def _check_turn_start(data: Any) -> str | None:
    return _int_field(data, "turn") if _is_obj(data) else _shape("{turn}", data)


def _check_turn_end(data: Any) -> str | None:
    if not _is_obj(data):
        return _shape("{turn, reason}", data)
    problem = _int_field(data, "turn")
    if problem is not None:
        return problem
    reason = data.get("reason")
    if not (_is_obj(reason) and _nonempty_str(reason.get("kind"))):
        return "turn/end reason must be an object with a non-empty kind"
    kind = reason["kind"]
    if kind == "aborted":
        cause = reason.get("reason")
        if not (_is_obj(cause) and _nonempty_str(cause.get("kind"))):
            return "an aborted turn/end reason must carry reason {kind}"
    elif kind == "error":
        error = reason.get("error")
        if not (_is_obj(error) and type(error.get("message")) is str and type(error.get("code")) is str):
            return "an error turn/end reason must carry error {message, code}"
    return None


def _check_step(data: Any) -> str | None:
    return _turn_step(data) if _is_obj(data) else _shape("{turn, step}", data)


def _check_user_message(data: Any) -> str | None:
    return _frame_problem(data, "user")


def _check_chunk(data: Any) -> str | None:
    if not _is_obj(data):
        return _shape("{turn, step, chunk}", data)
    if (problem := _turn_step(data)) is not None:
        return problem
    chunk = data.get("chunk")
    if not (_is_obj(chunk) and _nonempty_str(chunk.get("type"))):
        return "assistant/chunk chunk must be an object with a type"
    return None


def _check_assistant_message(data: Any) -> str | None:
    if not _is_obj(data):
        return _shape("{turn, step, message}", data)
    if (problem := _turn_step(data)) is not None:
        return problem
    message: Any = data.get("message")
    problem = _frame_problem(message, "assistant")
    if problem is not None:
        return problem
    source = message["source"]
    if source.get("kind") != "model":
        return 'assistant message source kind must be "model"'
    if type(source.get("provider")) is not str or type(source.get("model")) is not str:
        return "assistant message source must name provider and model"
    if "usage" in data and not _is_obj(data["usage"]):
        return "assistant/message usage must be an object"
    if "interrupted" in data and data["interrupted"] is not True:
        return "assistant/message interrupted may only be true"
    return None


def _check_tool_call(data: Any) -> str | None:
    if not _is_obj(data):
        return _shape("{turn, step, callId, name, arguments}", data)
    if (problem := _turn_step(data)) is not None:
        return problem
    if not _nonempty_str(data.get("callId")):
        return "tool/call callId must be a non-empty string"
    if type(data.get("name")) is not str:
        return "tool/call name must be a string"
    if type(data.get("arguments")) is not str:
        return "tool/call arguments must be the raw JSON text (a string)"
    return None


def _check_tool_result(data: Any) -> str | None:
    if not _is_obj(data):
        return _shape("{turn, step, message}", data)
    if (problem := _turn_step(data)) is not None:
        return problem
    message: Any = data.get("message")
    problem = _frame_problem(message, "user")
    if problem is not None:
        return problem
    source = message["source"]
    if source.get("kind") != "tool" or not _nonempty_str(source.get("callId")):
        return 'tool result source must be {kind: "tool", callId}'
    content = message["content"]
    if len(content) != 1 or content[0].get("type") != "tool-result":
        return "tool result content must be exactly one tool-result block"
    block = content[0]
    if block.get("toolCallId") != source["callId"]:
        return "tool-result toolCallId must equal source.callId"
    if not isinstance(block.get("content"), list):
        return "tool-result content must be an array of blocks"
    if "isError" in block and type(block["isError"]) is not bool:
        return "tool-result isError must be a boolean"
    if "error" in data:
        error = data["error"]
        if not (_is_obj(error) and type(error.get("name")) is str and type(error.get("code")) is str):
            return "tool/result error must be {name, code}"
    return None


def _check_request_context(data: Any) -> str | None:
    if not _is_obj(data):
        return _shape("{provider, model, contextWindow?}", data)
    for key in ("provider", "model"):
        if type(data.get(key)) is not str:
            return f"{key} is missing (it must be a string)" if key not in data else f"{key} must be a string"
    if "contextWindow" in data and not (is_safe_int(data["contextWindow"]) and data["contextWindow"] >= 0):
        return f"request/context contextWindow must be a non-negative safe integer, got {_got(data['contextWindow'])}"
    return None


def _check_object(data: Any) -> str | None:
    return None if _is_obj(data) else f"data must be an object, got {_got(data)}"


_CHECKS: Final[dict[str, Callable[[Any], str | None]]] = {
    "turn/start": _check_turn_start,
    "turn/end": _check_turn_end,
    "step/start": _check_step,
    "step/end": _check_step,
    "user/message": _check_user_message,
    "assistant/chunk": _check_chunk,
    "assistant/message": _check_assistant_message,
    "tool/call": _check_tool_call,
    "tool/result": _check_tool_result,
    "request/context": _check_request_context,
    "session/end-seed": _check_object,
}


SHAPE_CHECKED_TYPES: Final = frozenset(_CHECKS)
"""The types whose payload shape `data_problem` checks; every other known type's payload is opaque."""


def data_problem(kind: str, data: object) -> str | None:
    """Check the data shape of a checked core type; opaque and foreign types always pass."""
    check = _CHECKS.get(kind)
    if check is None:
        return None
    problem = check(data)
    return None if problem is None else f'session event "{kind}" has invalid data: {problem}'


# Shown under the name users import (docs/architecture.md#public-names).
SessionEvent.__module__ = "dsh"
SurfaceReplace.__module__ = "dsh.session"
