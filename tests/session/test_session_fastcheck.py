"""The read path's fast record check never accepts a record the full validation refuses, and it covers
only types of the full rule table."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.json import SAFE_INT_MAX
from dsh.session.events import (
    KNOWN_EVENT_TYPES,
    SHAPE_CHECKED_TYPES,
    SURFACE_TYPES,
    data_problem,
    envelope_problem,
    legacy_problem,
)
from dsh.session.fastcheck import FAST_CHECKED_TYPES, FAST_LOG_ONLY, FAST_SURFACE_APPEND, FAST_UNSURE, fast_check
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


def test_the_fast_check_covers_only_types_of_the_full_rule_table() -> None:
    """Every type the fast check can accept is a known type whose payload the full rules check, or one
    they leave opaque; the samples cover every such type, and the verdicts are three distinct constants."""
    assert FAST_CHECKED_TYPES <= KNOWN_EVENT_TYPES
    assert {"session/title", "subagent/descriptor"} == FAST_CHECKED_TYPES - SHAPE_CHECKED_TYPES
    assert {kind for kind, _data, _surface in SAMPLES} == FAST_CHECKED_TYPES
    assert {kind for kind, _data, surface in SAMPLES if surface} == SURFACE_TYPES
    assert len({FAST_UNSURE, FAST_LOG_ONLY, FAST_SURFACE_APPEND}) == 3


def _fully_valid(record: dict[str, Any], index: int) -> bool:
    """What the full rules say of `record` at position `index` (envelope, vocabulary, shape, seq)."""
    return (
        envelope_problem(record) is None
        and record["seq"] == index
        and legacy_problem(record["type"], record["data"]) is None
        and data_problem(record["type"], record["data"]) is None
    )


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


def _mutated(sample: tuple[str, Any, bool], choice: int, replacement: Any, action: str) -> dict[str, Any]:
    """A sample record with one part replaced, deleted or added to, as `orjson` parses it."""
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
    mutated: dict[str, Any] = orjson.loads(orjson.dumps(record))
    return mutated


_MUTATIONS = {
    "sample": st.sampled_from(SAMPLES),
    "choice": st.integers(0, 10_000),
    "replacement": _JSON,
    "action": st.sampled_from(["replace", "delete", "add"]),
    "index": st.sampled_from([0, 1]),
}


@settings(max_examples=examples(400), deadline=None)
@given(**_MUTATIONS)
def test_fast_acceptance_implies_full_acceptance(
    sample: tuple[str, Any, bool], choice: int, replacement: Any, action: str, index: int
) -> None:
    """Mutating any part of a valid record never yields one the fast path accepts but the full rules refuse."""
    record = _mutated(sample, choice, replacement, action)
    if fast_check(record, index) == FAST_UNSURE:
        return
    assert _fully_valid(record, index)


_EDGES: list[Any] = [
    0,
    1,
    -1,
    SAFE_INT_MAX,
    SAFE_INT_MAX + 1,
    -SAFE_INT_MAX,
    -SAFE_INT_MAX - 1,
    2**63,
    2**64 + 5,
    -(2**70),
    True,
    False,
    1.0,
    None,
    "1",
    "",
    [],
    {},
]


@pytest.mark.parametrize("edge", _EDGES, ids=repr)
def test_the_fast_check_never_outruns_the_full_rules_at_the_edges_of_every_value(edge: Any) -> None:
    """Integers at and beyond the safe range and beyond 64 bits, bools, floats, empty strings and
    containers in every position of every sample: whatever the fast check accepts, the full rules accept."""
    for sample in SAMPLES:
        base = _record(*sample)
        for path in _paths(base):
            if not path:
                continue
            record = copy.deepcopy(base)
            parent: Any = record
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = copy.deepcopy(edge)
            for index in (0, 1):
                if fast_check(record, index) != FAST_UNSURE:
                    assert _fully_valid(record, index), (sample[0], path, edge, index)


def test_non_records_and_unchecked_types_are_never_certain() -> None:
    """A list, a string, a dict without a string type or with a type it does not check is "not certain"."""
    records: list[Any] = [[], "x", 5, None, {"seq": 0}, {"type": 7, "seq": 0}, {"type": "x/custom", "seq": 0}]
    assert [fast_check(record, 0) for record in records] == [FAST_UNSURE] * len(records)
