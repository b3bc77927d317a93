"""Older shapes, migrated on read (docs/storage-format.md#older-event-shapes).

Layer: persistence (private to the read pipeline in `dsh.persistence._validation`). Logs written by
earlier versions of the TypeScript harness, and by earlier versions of dsh, spell a few events
differently; each shape has its own function here, applied before any other read rule. The stored
bytes are never rewritten, and a resumed session appends only current shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from dsh.json import is_safe_int
from dsh.session.fastcheck import FAST_UNSURE, fast_check
from dsh.session.stored import StoredRecords

__all__ = [
    "LegacyShapeError",
    "MalformedAt",
    "legacy_message_id",
    "migrate_assistant_message_identity",
    "migrate_legacy_shapes",
    "migrate_steering_message",
    "migrate_step_usage_cached_input",
    "migrate_tool_result_identity",
    "migrate_turn_end_reason",
    "migrate_turn_end_usage",
    "migrate_turn_start_trigger",
    "migrate_usage_chunk_cached_input",
    "migrate_user_message_identity",
]

# --------------------------------------------------------------------------------------------------
# Older upstream shapes (docs/storage-format.md#compatibility-with-the-typescript-harness)
#
# Logs written by earlier versions of the TypeScript harness spell a few events differently. Each
# shape is migrated on read by its own function, in the order the upstream reader applies them
# (`turn/start`, `turn/end`, steering, then message identity); the result is the current shape, the
# stored bytes stay as they are, and a resumed session appends only current shapes. A function
# returns its input unchanged when the record is not its shape, the migrated record (a new dict)
# when it is, and raises `LegacyShapeError` when the record starts like the old shape but is not
# exactly it: that is corruption, never a guess. The retired vocabulary the upstream reader refuses
# (`request/header-delta`, `mode/set`, a `fallback` header reason) has no migration and stays a
# format refusal.
#
# Earlier versions of dsh itself wrote token usage in two shapes the harness does not read: a
# `turn/end` carrying the turn's summed usage, and step usages whose `inputTokens` included the
# cached input, named `cachedInputTokens`. Both are migrated here the same way (after the harness's
# shapes), and neither is written again (docs/agent.md#token-usage).

_FAILURE_KEYS: Final = frozenset({"message", "code", "status", "providerRetryAfterMs", "requestId"})

MessageIdAt = Callable[[object], "str | None"]
"""Looks up the message id of the earlier event at a seq (None when there is none)."""


class LegacyShapeError(ValueError):
    """A record that starts like an older upstream shape but is not exactly that shape."""


def legacy_message_id(session_id: str, seq: object) -> str:
    """The id given to a message stored before messages had ids: `legacy-message:<session id>:<seq>`."""
    return f"legacy-message:{session_id}:{seq}"


def _malformed(record: dict[str, Any], why: str) -> LegacyShapeError:
    return LegacyShapeError(f"malformed legacy {record.get('type')} at seq {record.get('seq')!r}: {why}")


def _is_number(value: object) -> bool:
    return type(value) is int or type(value) is float


def _nonempty_str(value: object) -> bool:
    return type(value) is str and value != ""


def migrate_turn_start_trigger(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """An older `turn/start` also said what started the turn: `data = {turn, trigger: {kind, ...}}`.

    The current shape is `{turn}`. Only the complete old shape is migrated (data holds exactly
    `turn` and `trigger`, `turn` is a safe integer of at least 1, `trigger` an object with a
    non-empty string `kind`); the trigger is dropped.

    Raises:
        LegacyShapeError: A `turn/start` with a `trigger` that is not exactly the old shape.
    """
    data = record.get("data")
    if record.get("type") != "turn/start" or type(data) is not dict or "trigger" not in data:
        return record
    turn: Any = data.get("turn")
    trigger = data["trigger"]
    if not (is_safe_int(turn) and turn >= 1 and data.keys() == {"turn", "trigger"}):
        raise _malformed(record, "data must be exactly {turn >= 1, trigger}")
    if type(trigger) is not dict or not _nonempty_str(trigger.get("kind")):
        raise _malformed(record, "trigger must be an object with a non-empty kind")
    return dict(record, data={"turn": turn})


def _legacy_turn_end_reason(reason: dict[str, Any]) -> dict[str, Any]:
    """The current reason for one older reason (the caller checked the kind is an older one)."""
    kind = reason["kind"]
    if kind in ("aborted", "disposed"):
        if reason.keys() != {"kind"}:
            raise LegacyShapeError(f"an older {kind} reason holds only its kind")
        # A bare `aborted` never said who aborted; `disposed` was its own kind before it became a cause.
        return {"kind": "aborted", "reason": {"kind": "legacy" if kind == "aborted" else "disposed"}}
    step: Any = reason.get("step")
    if not (is_safe_int(step) and step >= 0):
        raise LegacyShapeError("an older error reason names its step (a non-negative safe integer)")
    failure = reason.get("failure")
    if (
        type(failure) is dict
        and reason.keys() == {"kind", "step", "failure"}
        and {"message", "code"} <= failure.keys() <= _FAILURE_KEYS
        and type(failure["message"]) is str
        and type(failure["code"]) is str
        and ("status" not in failure or _is_number(failure["status"]))
        and ("providerRetryAfterMs" not in failure or _is_number(failure["providerRetryAfterMs"]))
        and ("requestId" not in failure or type(failure["requestId"]) is str)
    ):
        return {"kind": "error", "error": failure}
    expected = {"kind", "step", "message", "code"} if "code" in reason else {"kind", "step", "message"}
    if reason.keys() != expected or type(reason["message"]) is not str or type(reason.get("code", "")) is not str:
        raise LegacyShapeError("an older error reason is {kind, step, failure} or {kind, step, message, code?}")
    return {"kind": "error", "error": {"message": reason["message"], "code": reason.get("code", "UNKNOWN")}}


def migrate_turn_end_reason(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """Older `turn/end` reasons: a bare `aborted`, `disposed`, and an `error` without its `error` object.

    They become `aborted` with cause `legacy`, `aborted` with cause `disposed`, and `error` with
    `error: {message, code, ...}` (the old `failure` object as it is, or the old `message` and
    `code`, `"UNKNOWN"` when there was none). Data must be exactly `{turn >= 1, reason}`. Current
    reasons, and kinds this build does not know, are left to the ordinary rules.

    Raises:
        LegacyShapeError: An older reason that is not exactly one of the old shapes.
    """
    data = record.get("data")
    if record.get("type") != "turn/end" or type(data) is not dict:
        return record
    reason = data.get("reason")
    if type(reason) is not dict:
        return record
    kind = reason.get("kind")
    older = (
        (kind == "aborted" and "reason" not in reason)
        or kind == "disposed"
        or (kind == "error" and "error" not in reason)
    )
    if not older:
        return record
    turn: Any = data.get("turn")
    if not (is_safe_int(turn) and turn >= 1 and data.keys() == {"turn", "reason"}):
        raise _malformed(record, "data must be exactly {turn >= 1, reason}")
    try:
        current = _legacy_turn_end_reason(reason)
    except LegacyShapeError as error:
        raise _malformed(record, str(error)) from None
    return dict(record, data=dict(data, reason=current))


def migrate_turn_end_usage(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """An earlier dsh `turn/end` also carried the turn's summed usage: `data = {turn, reason, usage}`.

    The current shape is `{turn, reason}`: each step's usage is on its `assistant/message`, and a
    turn's total is their sum, so the stored total is dropped. Only the complete old shape is
    migrated (data holds exactly `turn`, `reason` and `usage`, and `usage` is an object).

    Raises:
        LegacyShapeError: A `turn/end` with a `usage` that is not exactly the old shape.
    """
    data = record.get("data")
    if record.get("type") != "turn/end" or type(data) is not dict or "usage" not in data:
        return record
    if data.keys() != {"turn", "reason", "usage"} or type(data["usage"]) is not dict:
        raise _malformed(record, "data must be exactly {turn, reason, usage: object}")
    return dict(record, data={key: value for key, value in data.items() if key != "usage"})


_OLD_USAGE_KEYS: Final = frozenset({"inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens"})


def _disjoint_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The current usage for an older one whose `inputTokens` included `cachedInputTokens`.

    Raises:
        LegacyShapeError: Not exactly `{inputTokens, outputTokens, cachedInputTokens,
            reasoningTokens?}` with non-negative safe integer counts and no more cached than input.
    """
    if not ({"inputTokens", "outputTokens", "cachedInputTokens"} <= usage.keys() <= _OLD_USAGE_KEYS):
        raise LegacyShapeError(
            "an older usage is exactly {inputTokens, outputTokens, cachedInputTokens, reasoningTokens?}"
        )
    if not all(is_safe_int(count) and count >= 0 for count in usage.values()):
        raise LegacyShapeError("an older usage holds non-negative safe integer counts")
    inclusive = usage["inputTokens"]
    cached = usage["cachedInputTokens"]
    if cached > inclusive:
        raise LegacyShapeError(f"an older usage counts {cached} cached of only {inclusive} input tokens")
    current = {"inputTokens": inclusive - cached, "outputTokens": usage["outputTokens"], "cacheReadTokens": cached}
    if "reasoningTokens" in usage:
        current["reasoningTokens"] = usage["reasoningTokens"]
    return current


def _holds_cached_input(usage: object) -> bool:
    return type(usage) is dict and "cachedInputTokens" in usage


def migrate_step_usage_cached_input(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """An earlier dsh step usage counted cached input twice: `{inputTokens (all input), cachedInputTokens}`.

    The `usage` of an `assistant/message` becomes the disjoint shape: `{inputTokens: inputTokens -
    cachedInputTokens, outputTokens, cacheReadTokens: cachedInputTokens, reasoningTokens?}`.

    Raises:
        LegacyShapeError: A usage with `cachedInputTokens` that is not exactly the old shape.
    """
    data = record.get("data")
    if record.get("type") != "assistant/message" or type(data) is not dict:
        return record
    if not _holds_cached_input(data.get("usage")):
        return record
    try:
        usage = _disjoint_usage(data["usage"])
    except LegacyShapeError as error:
        raise _malformed(record, str(error)) from None
    return dict(record, data=dict(data, usage=usage))


def migrate_usage_chunk_cached_input(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """A logged usage chunk of an earlier dsh: `assistant/chunk` whose `chunk = {type: "usage", usage}`
    holds the older usage shape; it becomes the disjoint shape, as a step usage does.

    Raises:
        LegacyShapeError: A usage with `cachedInputTokens` that is not exactly the old shape.
    """
    data = record.get("data")
    if record.get("type") != "assistant/chunk" or type(data) is not dict:
        return record
    chunk = data.get("chunk")
    if type(chunk) is not dict or chunk.get("type") != "usage" or not _holds_cached_input(chunk.get("usage")):
        return record
    try:
        usage = _disjoint_usage(chunk["usage"])
    except LegacyShapeError as error:
        raise _malformed(record, str(error)) from None
    return dict(record, data=dict(data, chunk=dict(chunk, usage=usage)))


def migrate_steering_message(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """`steering/message` (a user message sent while a turn runs) became a plain `user/message`.

    Two old forms: `{turn, message}` (the message is kept as it is) and `{turn, content, source}`
    (the message gets `id = legacy-message:<session id>:<seq>` and `role: "user"`). The turn is
    dropped; the envelope (seq, time, surfaceOp) is kept.

    Raises:
        LegacyShapeError: A `steering/message` in neither form.
    """
    if record.get("type") != "steering/message":
        return record
    data = record.get("data")
    if type(data) is not dict or not is_safe_int(data.get("turn")):
        raise _malformed(record, "data must be an object with a safe integer turn")
    wrapped = data.get("message")
    if type(wrapped) is dict and data.keys() == {"turn", "message"}:
        return dict(record, type="user/message", data=wrapped)
    if data.keys() != {"turn", "content", "source"}:
        raise _malformed(record, "data must be exactly {turn, message} or {turn, content, source}")
    message = {key: value for key, value in data.items() if key != "turn"}
    message["id"] = legacy_message_id(session_id, record.get("seq"))
    message["role"] = "user"
    return dict(record, type="user/message", data=message)


def migrate_user_message_identity(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """A `user/message` stored before messages had ids: data `{content, source, ...}` without `id` and `role`.

    It gets `id = legacy-message:<session id>:<seq>` and `role: "user"`; other keys stay.
    """
    data = record.get("data")
    if (
        record.get("type") != "user/message"
        or type(data) is not dict
        or not {"content", "source"} <= data.keys()
        or not data.keys().isdisjoint(("id", "role", "message"))
    ):
        return record
    return dict(record, data=dict(data, id=legacy_message_id(session_id, record.get("seq")), role="user"))


def migrate_assistant_message_identity(record: dict[str, Any], session_id: str) -> dict[str, Any]:
    """An `assistant/message` stored before the message wrapper: data `{..., content, provenance}`.

    `content` and `provenance` move into `message = {id: legacy-message:<session id>:<seq>, role:
    "assistant", content, source: {...provenance, kind: "model"}}`; the other keys (`turn`,
    `step`, `usage` ...) stay.
    """
    data = record.get("data")
    if (
        record.get("type") != "assistant/message"
        or type(data) is not dict
        or "message" in data
        or not {"content", "provenance"} <= data.keys()
    ):
        return record
    rest = {key: value for key, value in data.items() if key not in ("content", "provenance")}
    provenance = data["provenance"]
    source = dict(provenance) if type(provenance) is dict else {}
    source["kind"] = "model"
    rest["message"] = {
        "id": legacy_message_id(session_id, record.get("seq")),
        "role": "assistant",
        "content": data["content"],
        "source": source,
    }
    return dict(record, data=rest)


def migrate_tool_result_identity(record: dict[str, Any], session_id: str, message_id_at: MessageIdAt) -> dict[str, Any]:
    """A `tool/result` stored before the message wrapper: data `{..., callId, content, isError}`.

    They become `message = {id, role: "user", content: [{type: "tool-result", toolCallId: callId,
    content, isError}], source: {kind: "tool", callId}}`. The id is `legacy-message:<session
    id>:<seq>`, except for a surface replace, which keeps the id of the message it replaces (the
    event at `surfaceOp.start`); when there is none the id stays empty and validation refuses it.
    """
    data = record.get("data")
    if (
        record.get("type") != "tool/result"
        or type(data) is not dict
        or "message" in data
        or not {"callId", "content", "isError"} <= data.keys()
    ):
        return record
    rest = {key: value for key, value in data.items() if key not in ("callId", "content", "isError")}
    op = record.get("surfaceOp")
    if type(op) is dict and op.get("op") == "replace" and _is_number(op.get("start")):
        message_id = message_id_at(op["start"])
    else:
        message_id = legacy_message_id(session_id, record.get("seq"))
    call_id = data["callId"]
    block = {"type": "tool-result", "toolCallId": call_id, "content": data["content"], "isError": data["isError"]}
    rest["message"] = {
        "id": message_id,
        "role": "user",
        "content": [block],
        "source": {"kind": "tool", "callId": call_id},
    }
    return dict(record, data=rest)


def _migrate_record(record: dict[str, Any], session_id: str, message_id_at: MessageIdAt) -> dict[str, Any]:
    """Every migration in turn (each returns its input when the record is not its shape)."""
    record = migrate_turn_start_trigger(record, session_id)
    record = migrate_turn_end_usage(record, session_id)
    record = migrate_turn_end_reason(record, session_id)
    record = migrate_steering_message(record, session_id)
    record = migrate_user_message_identity(record, session_id)
    record = migrate_assistant_message_identity(record, session_id)
    record = migrate_step_usage_cached_input(record, session_id)
    record = migrate_usage_chunk_cached_input(record, session_id)
    return migrate_tool_result_identity(record, session_id, message_id_at)


def _may_be_older(kind: object, data: object) -> bool:
    """A cheap superset test of "the migrations may change this record" (no false negatives).

    A log of current events passes it with a few dict lookups per record; only a hit runs the
    migrations.
    """
    if type(data) is not dict:
        return kind == "steering/message"
    if kind == "user/message":
        return "id" not in data
    if kind == "assistant/message":
        return "message" not in data or _holds_cached_input(data.get("usage"))
    if kind == "tool/result":
        return "message" not in data
    if kind == "assistant/chunk":
        chunk = data.get("chunk")
        return type(chunk) is dict and chunk.get("type") == "usage" and _holds_cached_input(chunk.get("usage"))
    if kind == "turn/start":
        return "trigger" in data
    if kind == "turn/end":
        reason = data.get("reason")
        return "usage" in data or (type(reason) is dict and reason.get("kind") in ("aborted", "disposed", "error"))
    return kind == "steering/message"


_OLDER_TYPES: Final = frozenset(
    {
        "turn/start",
        "turn/end",
        "steering/message",
        "user/message",
        "assistant/message",
        "assistant/chunk",
        "tool/result",
    }
)


def _message_id(record: Any) -> str | None:
    """The id of the message an event carries (`user/message`: its data; others: `data.message`)."""
    if type(record) is not dict:
        return None
    data = record.get("data")
    message = data if record.get("type") == "user/message" else (data.get("message") if type(data) is dict else None)
    found = message.get("id") if type(message) is dict else None
    return found if type(found) is str else None


def _candidates(records: StoredRecords, verdicts: bytearray | None) -> Iterable[tuple[int, Any]]:
    """`(position, record)` for every record that may hold an older shape.

    A fast-check verdict taken while reading is "certainly a valid current event", and no older
    shape passes the fast check, so with verdicts only the uncertain positions are offered (on the
    common path: none). Without them every record is offered; `_may_be_older` sorts them with a
    few dict lookups each.
    """
    if verdicts is None or len(verdicts) != len(records):
        return enumerate(records)
    unsure: list[int] = []
    index = verdicts.find(FAST_UNSURE)
    while index >= 0:
        unsure.append(index)
        index = verdicts.find(FAST_UNSURE, index + 1)
    return [(index, records[index]) for index in unsure]


@dataclass(frozen=True, slots=True)
class MalformedAt:
    """The first record whose older shape could not be migrated, and why."""

    index: int
    message: str


def migrate_legacy_shapes(
    session_id: str,
    records: StoredRecords,
    *,
    verdicts: bytearray | None = None,
    by_seq: bool = False,
) -> MalformedAt | None:
    """Migrate every older shape in `records`, in place; report the first malformed one.

    Args:
        session_id: The session the records belong to (part of the ids given to old messages).
        records: A whole log from seq 0 (`by_seq=False`: position = seq), or a typed selection
            (`by_seq=True`: earlier messages are looked up by their seq among the selection).
        verdicts: The fast-check verdicts of `records` by position, when the backend took them; a
            migrated record's verdict is updated in place.
        by_seq: See `records`.

    Returns:
        None, or the position and message of the first record that starts like an older shape but
        is not exactly it. Records after that one are left as they are (the caller refuses the log).
    """
    positions: dict[object, int] | None = None

    def message_id_at(seq: object, before: int) -> str | None:
        nonlocal positions
        if by_seq and positions is None:
            positions = {record.get("seq"): index for index, record in enumerate(records) if type(record) is dict}
        position = positions.get(seq) if positions is not None else seq
        if type(position) is not int or not 0 <= position < before:
            return None
        earlier = records[position]
        return _message_id(earlier) if type(earlier) is dict and earlier.get("seq") == seq else None

    older_types = _OLDER_TYPES
    for index, record in _candidates(records, verdicts):
        if type(record) is not dict:
            continue
        kind = record.get("type")
        if kind not in older_types or not _may_be_older(kind, record.get("data")):
            continue
        try:
            migrated = _migrate_record(record, session_id, functools.partial(message_id_at, before=index))
        except LegacyShapeError as error:
            return MalformedAt(index, str(error))
        if migrated is record:
            continue
        records.replace(index, migrated)
        if verdicts is not None and len(verdicts) == len(records):
            verdicts[index] = fast_check(migrated, index)
    return None
