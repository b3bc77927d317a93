"""The read path's fast record check never accepts a record the full validation refuses, and its C twin
(`dsh._speedups.check_records`) gives the same verdict on every record."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._accel import speedups
from dsh.json import SAFE_INT_MAX
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
    full_record = dict(record)
    assert full_record["seq"] == index
    assert envelope_problem(full_record) is None
    assert legacy_problem(full_record["type"], full_record["data"]) is None
    assert data_problem(full_record["type"], full_record["data"]) is None


needs_c = pytest.mark.skipif(speedups is None, reason="dsh._speedups is not built: only the Python check runs")


@needs_c
@settings(max_examples=examples(400), deadline=None)
@given(**_MUTATIONS)
def test_the_c_check_gives_the_python_verdict_on_every_mutated_record(
    sample: tuple[str, Any, bool], choice: int, replacement: Any, action: str, index: int
) -> None:
    """The C check and `fast_check` give the same verdict for any mutation of a valid record."""
    assert speedups is not None
    record = _mutated(sample, choice, replacement, action)
    verdicts, _types = speedups.check_records([record], index, False)
    assert verdicts[0] == fast_check(record, index)


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


@needs_c
@pytest.mark.parametrize("edge", _EDGES, ids=repr)
def test_the_c_check_agrees_at_the_edges_of_every_checked_value(edge: Any) -> None:
    """Integers at and beyond the safe range and beyond 64 bits, bools, floats, empty strings and
    containers in every position of every sample get the Python verdict from the C check."""
    assert speedups is not None
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
                verdicts, _types = speedups.check_records([record], index, False)
                assert verdicts[0] == fast_check(record, index), (sample[0], path, edge, index)


@needs_c
def test_the_c_check_judges_non_records_and_unknown_types_not_certain() -> None:
    """A list, a string, a dict without a string type or with a type it does not check is "not certain"."""
    assert speedups is not None
    records: list[Any] = [[], "x", 5, None, {"seq": 0}, {"type": 7, "seq": 0}, {"type": "x/custom", "seq": 0}]
    verdicts, types = speedups.check_records(records, 0, False)
    assert verdicts == bytes(len(records))
    assert types == [None, None, None, None, None, 7, "x/custom"]
