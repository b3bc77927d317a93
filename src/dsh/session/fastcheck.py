"""A fast acceptance test for stored event records (the read path's common case).

Layer: session. `check_records` validates every record of every cold read, so its per-record cost
decides how close a full read comes to the machine limit. This module answers one
question quickly: "is this record certainly valid?". It accepts only records the full rules in
`dsh.session.events` accept (a property test pins that), with every check inlined into one function
per event type and missing keys caught by one `try`; anything unusual — a foreign type, extra
envelope keys, a replace, an aborted turn, a defect, an older upstream shape the read pipeline
migrates — answers "not certain" and the caller runs the full checks, which produce the exact message.
It never decides that a record is invalid on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dsh.json import SAFE_INT_MAX

__all__ = ["FAST_LOG_ONLY", "FAST_SURFACE_APPEND", "FAST_UNSURE", "fast_check"]

FAST_UNSURE: Final = 0
FAST_LOG_ONLY: Final = 1
FAST_SURFACE_APPEND: Final = 2

_MAX: Final = SAFE_INT_MAX
# Aborted and error reasons carry nested shapes, and older logs spell some reasons differently
# (`disposed`, an aborted or error reason without its nested part): the full rules and the read
# pipeline's migrations judge those.
_FULL_CHECK_REASONS: Final = frozenset({"aborted", "error", "disposed"})

# Every checker takes the whole record and its index and reads keys directly: a missing key or a
# wrong container type raises, which `fast_check` turns into "not certain". `.__class__ is` checks
# are exact type checks (a bool is never an int, a dict subclass is never a plain object).


def _head(r: Any, i: int, n: int) -> bool:
    """Exactly `n` envelope keys, `seq == i`, a safe integer `time`."""
    seq = r["seq"]
    time = r["time"]
    return len(r) == n and seq.__class__ is int and seq == i and time.__class__ is int and -_MAX <= time <= _MAX


def _frame(m: Any, role: str) -> bool:
    """A message frame: non-empty id, the role, typed blocks, a source with a kind."""
    mid = m["id"]
    content = m["content"]
    kind = m["source"]["kind"]
    if (
        m.__class__ is not dict
        or mid.__class__ is not str
        or not mid
        or m["role"] != role
        or content.__class__ is not list
        or m["source"].__class__ is not dict
        or kind.__class__ is not str
        or not kind
    ):
        return False
    for block in content:
        block_type = block["type"]
        if block.__class__ is not dict or block_type.__class__ is not str or not block_type:
            return False
    return True


def _turn_step(d: Any) -> bool:
    turn = d["turn"]
    step = d["step"]
    return (
        d.__class__ is dict
        and turn.__class__ is int
        and step.__class__ is int
        and 0 <= turn <= _MAX
        and 0 <= step <= _MAX
    )


def _turn_start(r: Any, i: int) -> bool:
    d = r["data"]
    turn = d["turn"]
    # An older `turn/start` also carried `trigger`; the read pipeline migrates that shape.
    return _head(r, i, 4) and d.__class__ is dict and turn.__class__ is int and 0 <= turn <= _MAX and "trigger" not in d


def _turn_end(r: Any, i: int) -> bool:
    d = r["data"]
    turn = d["turn"]
    reason = d["reason"]
    kind = reason["kind"]
    return (
        _head(r, i, 4)
        and d.__class__ is dict
        and turn.__class__ is int
        and 0 <= turn <= _MAX
        and reason.__class__ is dict
        and kind.__class__ is str
        and kind != ""
        and kind not in _FULL_CHECK_REASONS
    )


def _step(r: Any, i: int) -> bool:
    return _head(r, i, 4) and _turn_step(r["data"])


def _chunk(r: Any, i: int) -> bool:
    d = r["data"]
    chunk = d["chunk"]
    kind = chunk["type"]
    return _head(r, i, 4) and _turn_step(d) and chunk.__class__ is dict and kind.__class__ is str and kind != ""


def _tool_call(r: Any, i: int) -> bool:
    d = r["data"]
    call_id = d["callId"]
    return (
        _head(r, i, 4)
        and _turn_step(d)
        and call_id.__class__ is str
        and call_id != ""
        and d["name"].__class__ is str
        and d["arguments"].__class__ is str
    )


def _request_context(r: Any, i: int) -> bool:
    d = r["data"]
    if not (_head(r, i, 4) and d.__class__ is dict and d["provider"].__class__ is str and d["model"].__class__ is str):
        return False
    window = d.get("contextWindow", 0)
    return window.__class__ is int and 0 <= window <= _MAX


def _end_seed(r: Any, i: int) -> bool:
    return _head(r, i, 4) and r["data"].__class__ is dict


def _opaque(r: Any, i: int) -> bool:
    r["data"]
    return _head(r, i, 4)


def _appended(r: Any, i: int) -> bool:
    return r["surfaceOp"] == "append" and _head(r, i, 5)


def _user_message(r: Any, i: int) -> bool:
    return _appended(r, i) and _frame(r["data"], "user")


def _assistant_message(r: Any, i: int) -> bool:
    d = r["data"]
    if not (_appended(r, i) and _turn_step(d)):
        return False
    message = d["message"]
    if not _frame(message, "assistant"):
        return False
    source = message["source"]
    if source["kind"] != "model" or source["provider"].__class__ is not str or source["model"].__class__ is not str:
        return False
    if "usage" in d and d["usage"].__class__ is not dict:
        return False
    return "interrupted" not in d or d["interrupted"] is True


def _tool_result(r: Any, i: int) -> bool:
    d = r["data"]
    if not (_appended(r, i) and _turn_step(d)):
        return False
    message = d["message"]
    if not _frame(message, "user"):
        return False
    source = message["source"]
    call_id = source["callId"]
    content = message["content"]
    if source["kind"] != "tool" or call_id.__class__ is not str or not call_id or len(content) != 1:
        return False
    block = content[0]
    if block["type"] != "tool-result" or block["toolCallId"] != call_id or block["content"].__class__ is not list:
        return False
    if "isError" in block and block["isError"].__class__ is not bool:
        return False
    if "error" in d:
        error = d["error"]
        if error.__class__ is not dict or error["name"].__class__ is not str or error["code"].__class__ is not str:
            return False
    return True


_CHECKS: Final[dict[str, tuple[Callable[[Any, int], bool], int]]] = {
    "turn/start": (_turn_start, FAST_LOG_ONLY),
    "turn/end": (_turn_end, FAST_LOG_ONLY),
    "step/start": (_step, FAST_LOG_ONLY),
    "step/end": (_step, FAST_LOG_ONLY),
    "assistant/chunk": (_chunk, FAST_LOG_ONLY),
    "tool/call": (_tool_call, FAST_LOG_ONLY),
    "request/context": (_request_context, FAST_LOG_ONLY),
    "session/end-seed": (_end_seed, FAST_LOG_ONLY),
    "session/title": (_opaque, FAST_LOG_ONLY),
    "subagent/descriptor": (_opaque, FAST_LOG_ONLY),
    "user/message": (_user_message, FAST_SURFACE_APPEND),
    "assistant/message": (_assistant_message, FAST_SURFACE_APPEND),
    "tool/result": (_tool_result, FAST_SURFACE_APPEND),
}


def fast_check(record: Any, index: int) -> int:
    """`FAST_LOG_ONLY` / `FAST_SURFACE_APPEND` when `record` is certainly a valid event at `index`
    (contiguous seq included), else `FAST_UNSURE`."""
    try:
        check, verdict = _CHECKS[record["type"]]
        if record.__class__ is dict and check(record, index):
            return verdict
    except (KeyError, TypeError, AttributeError, IndexError):
        pass
    return FAST_UNSURE
