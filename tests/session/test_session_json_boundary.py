"""The JSON boundary at append: non-JSON data is refused with a path and nothing is appended."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
from typing import Any

import pytest
from pydantic import BaseModel

from dsh.json import MAX_DEPTH, FrozenDict, NotJsonError
from dsh.session import Session, SessionError, SessionStore


class _Color(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    ONE = 1


@dataclasses.dataclass
class _Point:
    x: int


class _Model(BaseModel):
    x: int = 1


class _Str(str):
    pass


class _Int(int):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


def _cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


def _cyclic_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


_REFUSED: list[tuple[str, Any, str]] = [
    ("nan", {"v": float("nan")}, "$.v"),
    ("inf", {"v": float("inf")}, "$.v"),
    ("-inf", {"v": [0, float("-inf")]}, "$.v[1]"),
    ("-0.0", {"v": -0.0}, "$.v"),
    ("2**53", {"v": 2**53}, "$.v"),
    ("-(2**53)", {"v": -(2**53)}, "$.v"),
    ("2**64", {"v": 2**64}, "$.v"),
    ("bytes", {"v": b"x"}, "$.v"),
    ("bytearray", {"v": bytearray(b"x")}, "$.v"),
    ("set", {"v": {1, 2}}, "$.v"),
    ("frozenset", {"v": frozenset()}, "$.v"),
    ("Decimal", {"v": decimal.Decimal(1)}, "$.v"),
    ("datetime", {"v": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}, "$.v"),
    ("date", {"v": datetime.date(2024, 1, 1)}, "$.v"),
    ("Enum", {"v": _Color.RED}, "$.v"),
    ("IntEnum", {"v": _Level.ONE}, "$.v"),
    ("dataclass", {"v": _Point(1)}, "$.v"),
    ("pydantic", {"v": _Model()}, "$.v"),
    ("str subclass", {"v": _Str("x")}, "$.v"),
    ("int subclass", {"v": _Int(1)}, "$.v"),
    ("dict subclass", {"v": _Dict()}, "$.v"),
    ("OrderedDict", {"v": collections.OrderedDict()}, "$.v"),
    ("defaultdict", {"v": collections.defaultdict(list)}, "$.v"),
    ("list subclass", {"v": _List()}, "$.v"),
    ("object", {"v": object()}, "$.v"),
    ("complex", {"v": 1j}, "$.v"),
    ("int key", {"k": {1: "a"}}, "$.k"),
    ("tuple key", {"k": {(1,): "a"}}, "$.k"),
    ("None key", {None: "a"}, "$"),
    ("str-subclass key", {_Str("k"): 1}, "$"),
    ("lone surrogate value", {"v": "\ud800"}, "$.v"),
    ("lone surrogate key", {"k": {"\udfff": 1}}, "$.k"),
    ("cyclic dict", {"c": _cyclic_dict()}, "$.c.self"),
    ("cyclic list", {"c": _cyclic_list()}, "$.c[1]"),
    ("non-identifier key path", {"a b": {"v": float("nan")}}, '$["a b"].v'),
    ("deep path", {"message": {"content": [0, 1, {"x": b""}]}}, "$.message.content[2].x"),
]


def _title_session(store: SessionStore) -> Session:
    session = store.create()
    session.append("session/title", {"title": "first"})
    return session


@pytest.mark.parametrize(("label", "data", "path"), _REFUSED, ids=[item[0] for item in _REFUSED])
def test_non_json_data_is_refused_with_a_path(store: SessionStore, label: str, data: Any, path: str) -> None:
    """Each non-JSON value is refused as NOT_JSON with its JSON path; seq and events are unchanged."""
    session = _title_session(store)
    events_before = list(session.events)
    with pytest.raises(NotJsonError) as caught:
        session.append("session/title", data)
    error = caught.value
    assert error.code == "NOT_JSON"
    assert error.path == path, label
    assert error.message == (
        f'session event "session/title" carries data that is not lossless JSON at {path}: {error.reason}'
    )
    assert error.reason
    assert session.seq == 1
    assert list(session.events) == events_before


def test_top_level_non_json_value_path_is_root(store: SessionStore) -> None:
    """A non-JSON top-level value is reported at `$`."""
    session = _title_session(store)
    with pytest.raises(NotJsonError) as caught:
        session.append("session/title", {1, 2})
    assert caught.value.path == "$"
    assert session.seq == 1


def test_not_json_error_is_a_value_error() -> None:
    """NotJsonError is both a DshError and a ValueError."""
    assert issubclass(NotJsonError, ValueError)


def test_shared_acyclic_sub_objects_are_accepted(store: SessionStore) -> None:
    """A sub-dict used twice (no cycle) is accepted and copied at both places."""
    session = _title_session(store)
    shared = {"a": [1, 2]}
    event = session.append("session/title", {"x": shared, "y": shared, "z": [shared, shared]})
    data: Any = event.data
    assert data["x"] == data["y"] == shared
    assert type(data["x"]) is FrozenDict


def _nested_lists(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_value_exactly_at_the_depth_cap_is_accepted(store: SessionStore) -> None:
    """Data nested so that event + data is exactly 200 levels is accepted."""
    session = _title_session(store)
    data_depth = MAX_DEPTH - 1  # the envelope is the first level
    event = session.append("session/title", _nested_lists(data_depth))
    assert session.seq == 2
    depth, node = 0, event.data
    while isinstance(node, list):
        depth += 1
        node = node[0] if node else None
    assert depth == data_depth


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 100_000])
def test_nesting_past_the_depth_cap_is_a_clean_refusal(store: SessionStore, depth: int) -> None:
    """Nesting just past the cap, or 100,000 deep, is NOT_JSON at the crossing path (no RecursionError)."""
    session = _title_session(store)
    data = _nested_lists(depth)
    with pytest.raises(NotJsonError) as caught:
        session.append("session/title", data)
    # Level 201 (the envelope is level 1, the data root level 2) sits 199 `[0]` steps below the root.
    assert caught.value.path == "$" + "[0]" * (MAX_DEPTH - 1)
    assert "nesting" in caught.value.reason
    assert session.seq == 1


def test_deep_nesting_inside_objects_reports_the_key_path(store: SessionStore) -> None:
    """The depth refusal path names object keys on the way down."""
    session = _title_session(store)
    data: Any = 0
    for _ in range(MAX_DEPTH):
        data = {"k": data}
    with pytest.raises(NotJsonError) as caught:
        session.append("session/title", data)
    assert caught.value.path == "$" + ".k" * (MAX_DEPTH - 1)


def test_seed_with_non_json_data_is_invalid_seed(store: SessionStore) -> None:
    """A seed event carrying non-JSON data is refused as INVALID_SEED naming index and path; nothing is built."""
    seed = [{"type": "session/title", "seq": 0, "time": 1, "data": {"v": float("nan")}}]
    with pytest.raises(SessionError) as caught:
        store.prepare("s", seed=seed)
    assert caught.value.code == "INVALID_SEED"
    assert caught.value.message == (
        "seed event at index 0 carries data that is not lossless JSON at $[0].data.v: nan is not a finite number"
    )
    assert store.get("s") is None


def test_source_event_seqs_cross_the_boundary(store: SessionStore) -> None:
    """Surface metadata crosses the boundary: a non-JSON seq list is refused and nothing is appended."""
    session = store.create()
    session.append("user/message", {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}})
    with pytest.raises((NotJsonError, SessionError)):
        session.append(
            "user/message",
            {"id": "u2", "role": "user", "content": [], "source": {"kind": "user"}},
            source_event_seqs=[float("nan")],  # type: ignore[list-item]
        )
    assert session.seq == 1


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "nan is not a finite number"),
        (float("inf"), "inf is not a finite number"),
        (2**53, "integer 9007199254740992 is outside the safe range \u00b1(2**53-1)"),
        (-(2**53), "integer -9007199254740992 is outside the safe range \u00b1(2**53-1)"),
        (-0.0, "-0.0 does not survive a JSON round trip"),
    ],
)
def test_each_refused_number_is_refused_with_its_own_reason(store: SessionStore, value: Any, reason: str) -> None:
    """NaN, infinities, 2**53 and -0.0 are each refused with a message that says what is wrong with them."""
    session = _title_session(store)
    with pytest.raises(NotJsonError) as caught:
        session.append("session/title", {"title": "t", "v": value})
    assert caught.value.reason == reason
    assert (
        caught.value.message == f'session event "session/title" carries data that is not lossless JSON at $.v: {reason}'
    )
    assert session.seq == 1


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"turn": 1.5}, "turn must be a non-negative safe integer, got 1.5"),
        ({"turn": -1}, "turn must be a non-negative safe integer, got -1"),
        ({"turn": "1"}, "turn must be a non-negative safe integer, got a string"),
        ({}, "turn is missing (it must be a non-negative safe integer)"),
        ([1], "data must be an object {turn}, got an array"),
    ],
)
def test_a_refused_turn_names_the_field_and_the_value(store: SessionStore, data: Any, reason: str) -> None:
    """A `turn/start` whose turn is fractional, negative, a string or missing says so, naming the field and value."""
    session = store.create()
    with pytest.raises(SessionError) as caught:
        session.append("turn/start", data)
    assert caught.value.code == "INVALID_EVENT"
    assert f'session event "turn/start" has invalid data: {reason}' in caught.value.message
