"""A fast acceptance test for stored event records (the read path's common case).

Layer: session. `check_records` validates every record of every cold read, so its per-record cost
decides how close a full read comes to the machine limit. This module answers one
question quickly: "is this record certainly valid?". It accepts only records the full rules in
`dsh.session.events` accept (a property test pins that), with every check of a type written out in
one function (no helper calls: a Python call costs as much as several checks) and missing keys
caught by one `try`; anything unusual — a foreign type, extra envelope keys, a replace, an aborted
turn, a defect, an older upstream shape the read pipeline migrates — answers "not certain" and the
caller runs the full checks, which produce the exact message. It never decides that a record is
invalid on its own. The verdicts are the named constants below; the JSONL scanner keeps one per
record (a `bytes`), so validation visits only the records the check was unsure of.

The full rules stay the one source of truth: every type checked here is a type of the rule table in
`dsh.session.events` (or one whose payload that table leaves opaque), and a differential property
test holds each checker to those rules on mutated records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dsh.json import SAFE_INT_MAX

__all__ = ["FAST_CHECKED_TYPES", "FAST_LOG_ONLY", "FAST_SURFACE_APPEND", "FAST_UNSURE", "fast_check"]

FAST_UNSURE: Final = 0
"""Not certain: the full rules judge the record (and word the exact error if it is invalid)."""
FAST_LOG_ONLY: Final = 1
"""Certainly a valid log-only event at its position."""
FAST_SURFACE_APPEND: Final = 2
"""Certainly a valid surface event with `surfaceOp: "append"` at its position (a new surface node)."""

_MAX: Final = SAFE_INT_MAX
_MIN: Final = -SAFE_INT_MAX
# Aborted and error reasons carry nested shapes, and older logs spell some reasons differently
# (`disposed`, an aborted or error reason without its nested part): the full rules and the read
# pipeline's migrations judge those.
_FULL_CHECK_REASONS: Final = frozenset({"aborted", "error", "disposed"})
_FULL_CHECK_CHUNKS: Final = frozenset({"", "usage"})

# Every checker takes the whole record and its index, reads keys directly and returns its verdict:
# a missing key or a wrong container type raises, which `fast_check` turns into "not certain".
# `.__class__ is` checks are exact type checks (a bool is never an int, a dict subclass is never a
# plain object). Each starts with the envelope: exactly 4 keys (5 with `surfaceOp: "append"`),
# `seq == index`, a safe integer `time`, then the payload's own rules.
_int = int
_str = str
_dict = dict
_list = list


def _frame_ok(m: Any, role: str) -> bool:
    """A message frame: non-empty id, the role, typed blocks, a source with a kind."""
    mid = m["id"]
    content = m["content"]
    source = m["source"]
    kind = source["kind"]
    if (
        m.__class__ is not _dict
        or mid.__class__ is not _str
        or not mid
        or m["role"] != role
        or content.__class__ is not _list
        or source.__class__ is not _dict
        or kind.__class__ is not _str
        or not kind
    ):
        return False
    for block in content:
        block_type = block["type"]
        if block.__class__ is not _dict or block_type.__class__ is not _str or not block_type:
            return False
    return True


def _turn_start(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if len(r) != 4 or seq.__class__ is not _int or seq != i or time.__class__ is not _int or d.__class__ is not _dict:
        return FAST_UNSURE
    turn = d["turn"]
    # An older `turn/start` also carried `trigger`; the read pipeline migrates that shape.
    if _MIN <= time <= _MAX and turn.__class__ is _int and 0 <= turn <= _MAX and "trigger" not in d:
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _turn_end(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if len(r) != 4 or seq.__class__ is not _int or seq != i or time.__class__ is not _int or d.__class__ is not _dict:
        return FAST_UNSURE
    turn = d["turn"]
    reason = d["reason"]
    if reason.__class__ is not _dict:
        return FAST_UNSURE
    kind = reason["kind"]
    # Any key besides `turn` and `reason` (an older log's `usage`): the read pipeline judges it.
    if (
        _MIN <= time <= _MAX
        and turn.__class__ is _int
        and 0 <= turn <= _MAX
        and kind.__class__ is _str
        and kind != ""
        and kind not in _FULL_CHECK_REASONS
        and len(d) == 2
    ):
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _step(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if len(r) != 4 or seq.__class__ is not _int or seq != i or time.__class__ is not _int or d.__class__ is not _dict:
        return FAST_UNSURE
    turn = d["turn"]
    step = d["step"]
    if (
        _MIN <= time <= _MAX
        and turn.__class__ is _int
        and step.__class__ is _int
        and 0 <= turn <= _MAX
        and 0 <= step <= _MAX
    ):
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _chunk(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if len(r) != 4 or seq.__class__ is not _int or seq != i or time.__class__ is not _int or d.__class__ is not _dict:
        return FAST_UNSURE
    turn = d["turn"]
    step = d["step"]
    chunk = d["chunk"]
    if chunk.__class__ is not _dict:
        return FAST_UNSURE
    kind = chunk["type"]
    if (
        _MIN <= time <= _MAX
        and turn.__class__ is _int
        and step.__class__ is _int
        and 0 <= turn <= _MAX
        and 0 <= step <= _MAX
        and kind.__class__ is _str
        # Not empty, and not a usage chunk: one may hold an older usage shape, which the read
        # pipeline migrates.
        and kind not in _FULL_CHECK_CHUNKS
    ):
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _tool_call(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if len(r) != 4 or seq.__class__ is not _int or seq != i or time.__class__ is not _int or d.__class__ is not _dict:
        return FAST_UNSURE
    turn = d["turn"]
    step = d["step"]
    call_id = d["callId"]
    if (
        _MIN <= time <= _MAX
        and turn.__class__ is _int
        and step.__class__ is _int
        and 0 <= turn <= _MAX
        and 0 <= step <= _MAX
        and call_id.__class__ is _str
        and call_id != ""
        and d["name"].__class__ is _str
        and d["arguments"].__class__ is _str
    ):
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _request_context(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if len(r) != 4 or seq.__class__ is not _int or seq != i or time.__class__ is not _int or d.__class__ is not _dict:
        return FAST_UNSURE
    window = d.get("contextWindow", 0)
    if (
        _MIN <= time <= _MAX
        and d["provider"].__class__ is _str
        and d["model"].__class__ is _str
        and window.__class__ is _int
        and 0 <= window <= _MAX
    ):
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _end_seed(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    if (
        len(r) == 4
        and seq.__class__ is _int
        and seq == i
        and time.__class__ is _int
        and _MIN <= time <= _MAX
        and r["data"].__class__ is _dict
    ):
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _opaque(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    r["data"]
    if len(r) == 4 and seq.__class__ is _int and seq == i and time.__class__ is _int and _MIN <= time <= _MAX:
        return FAST_LOG_ONLY
    return FAST_UNSURE


def _user_message(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    if (
        len(r) == 5
        and r["surfaceOp"] == "append"
        and seq.__class__ is _int
        and seq == i
        and time.__class__ is _int
        and _MIN <= time <= _MAX
        and _frame_ok(r["data"], "user")
    ):
        return FAST_SURFACE_APPEND
    return FAST_UNSURE


def _assistant_message(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if (
        len(r) != 5
        or r["surfaceOp"] != "append"
        or seq.__class__ is not _int
        or seq != i
        or time.__class__ is not _int
        or d.__class__ is not _dict
    ):
        return FAST_UNSURE
    turn = d["turn"]
    step = d["step"]
    if not (
        _MIN <= time <= _MAX
        and turn.__class__ is _int
        and step.__class__ is _int
        and 0 <= turn <= _MAX
        and 0 <= step <= _MAX
    ):
        return FAST_UNSURE
    message = d["message"]
    if not _frame_ok(message, "assistant"):
        return FAST_UNSURE
    source = message["source"]
    if source["kind"] != "model" or source["provider"].__class__ is not _str or source["model"].__class__ is not _str:
        return FAST_UNSURE
    # An older usage shape (`cachedInputTokens`) is migrated by the read pipeline.
    if "usage" in d and (d["usage"].__class__ is not _dict or "cachedInputTokens" in d["usage"]):
        return FAST_UNSURE
    return FAST_SURFACE_APPEND if "interrupted" not in d or d["interrupted"] is True else FAST_UNSURE


def _tool_result(r: Any, i: int) -> int:
    seq = r["seq"]
    time = r["time"]
    d = r["data"]
    if (
        len(r) != 5
        or r["surfaceOp"] != "append"
        or seq.__class__ is not _int
        or seq != i
        or time.__class__ is not _int
        or d.__class__ is not _dict
    ):
        return FAST_UNSURE
    turn = d["turn"]
    step = d["step"]
    if not (
        _MIN <= time <= _MAX
        and turn.__class__ is _int
        and step.__class__ is _int
        and 0 <= turn <= _MAX
        and 0 <= step <= _MAX
    ):
        return FAST_UNSURE
    message = d["message"]
    if not _frame_ok(message, "user"):
        return FAST_UNSURE
    source = message["source"]
    call_id = source["callId"]
    content = message["content"]
    if source["kind"] != "tool" or call_id.__class__ is not _str or not call_id or len(content) != 1:
        return FAST_UNSURE
    block = content[0]
    if block["type"] != "tool-result" or block["toolCallId"] != call_id or block["content"].__class__ is not _list:
        return FAST_UNSURE
    if "isError" in block and block["isError"].__class__ is not bool:
        return FAST_UNSURE
    if "error" in d:
        error = d["error"]
        if error.__class__ is not _dict or error["name"].__class__ is not _str or error["code"].__class__ is not _str:
            return FAST_UNSURE
    return FAST_SURFACE_APPEND


_CHECKS: Final[dict[str, Callable[[Any, int], int]]] = {
    "turn/start": _turn_start,
    "turn/end": _turn_end,
    "step/start": _step,
    "step/end": _step,
    "assistant/chunk": _chunk,
    "tool/call": _tool_call,
    "request/context": _request_context,
    "session/end-seed": _end_seed,
    "session/title": _opaque,
    "subagent/descriptor": _opaque,
    "user/message": _user_message,
    "assistant/message": _assistant_message,
    "tool/result": _tool_result,
}

FAST_CHECKED_TYPES: Final = frozenset(_CHECKS)
"""The types the fast check can be certain of; a record of any other type is always `FAST_UNSURE`."""


def fast_check(record: Any, index: int) -> int:
    """`FAST_LOG_ONLY` / `FAST_SURFACE_APPEND` when `record` is certainly a valid event at `index`
    (contiguous seq included), else `FAST_UNSURE`."""
    try:
        if record.__class__ is _dict:
            return _CHECKS[record["type"]](record, index)
    except (KeyError, TypeError, AttributeError, IndexError):
        pass
    return FAST_UNSURE
