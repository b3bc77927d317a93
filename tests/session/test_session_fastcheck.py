"""The read path's fast record check never accepts a record the full validation refuses."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.session.events import data_problem, envelope_problem, legacy_problem
from dsh.session.fastcheck import FAST_LOG_ONLY, FAST_SURFACE_APPEND, FAST_UNSURE, fast_check
from tests.helpers import examples


def _message(role: str, **source: Any) -> dict[str, Any]:
    return {"id": "m", "role": role, "content": [{"type": "text", "text": "x"}], "source": source or {"kind": "user"}}


_TOOL_RESULT = {
    "id": "r",
    "role": "user",
    "source": {"kind": "tool", "callId": "c"},
    "content": [{"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "ok"}]}],
}

SAMPLES: list[tuple[str, Any, bool]] = [
    ("turn/start", {"turn": 1}, False),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}, False),
    ("step/start", {"turn": 1, "step": 1}, False),
    ("step/end", {"turn": 1, "step": 1}, False),
    ("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "a"}}, False),
    ("tool/call", {"turn": 1, "step": 1, "callId": "c", "name": "n", "arguments": "{}"}, False),
    ("request/context", {"provider": "p", "model": "m", "contextWindow": 10}, False),
    ("session/end-seed", {}, False),
    ("session/title", {"title": "t"}, False),
    ("subagent/descriptor", {"version": 2}, False),
    ("user/message", _message("user"), True),
    (
        "assistant/message",
        {"turn": 1, "step": 1, "message": _message("assistant", kind="model", provider="p", model="m")},
        True,
    ),
    ("tool/result", {"turn": 1, "step": 1, "message": _TOOL_RESULT}, True),
]


def _record(kind: str, data: Any, surface: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"type": kind, "seq": 0, "time": 5, "data": copy.deepcopy(data)}
    if surface:
        record["surfaceOp"] = "append"
    return record


def test_every_sample_is_certain() -> None:
    """Each canonical valid record of a checked or opaque type is accepted by the fast path."""
    for kind, data, surface in SAMPLES:
        verdict = fast_check(_record(kind, data, surface), 0)
        assert verdict == (FAST_SURFACE_APPEND if surface else FAST_LOG_ONLY), kind


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


@settings(max_examples=examples(400), deadline=None)
@given(
    sample=st.sampled_from(SAMPLES),
    choice=st.integers(0, 10_000),
    replacement=_JSON,
    action=st.sampled_from(["replace", "delete", "add"]),
    index=st.sampled_from([0, 1]),
)
def test_fast_acceptance_implies_full_acceptance(
    sample: tuple[str, Any, bool], choice: int, replacement: Any, action: str, index: int
) -> None:
    """Mutating any part of a valid record never yields one the fast path accepts but the full rules refuse."""
    kind, data, surface = sample
    record = _record(kind, data, surface)
    paths = _paths(record)
    path = paths[choice % len(paths)]
    if path:
        parent: Any = record
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if action == "replace":
            parent[last] = replacement
        elif action == "delete" and isinstance(parent, dict):
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[f"{last}_extra"] = replacement
    record = orjson.loads(orjson.dumps(record))
    if fast_check(record, index) == FAST_UNSURE:
        return
    full_record = dict(record)
    assert full_record["seq"] == index
    assert envelope_problem(full_record) is None
    assert legacy_problem(full_record["type"], full_record["data"]) is None
    assert data_problem(full_record["type"], full_record["data"]) is None
