"""The lossless JSON boundary: frozen containers, freeze/adopt/thaw/dumps/loads, round-trip properties."""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import sys
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.errors import DshError
from dsh.json import (
    _MODE_FREEZE,
    MAX_DEPTH,
    SAFE_INT_MAX,
    FrozenDict,
    FrozenList,
    NotJsonError,
    _convert,
    adopt,
    dumps,
    freeze,
    is_json,
    is_safe_int,
    loads,
    thaw,
)
from dsh.session import SessionEvent
from tests.helpers import examples

# Every method of dict / list that changes the object in place (CPython 3.11+).
_DICT_MUTATORS: dict[str, Callable[[Any], object]] = {
    "__setitem__": lambda d: d.__setitem__("k", 1),
    "__delitem__": lambda d: d.__delitem__("a"),
    "__ior__": lambda d: d.__ior__({"k": 1}),
    "clear": lambda d: d.clear(),
    "pop": lambda d: d.pop("a"),
    "popitem": lambda d: d.popitem(),
    "setdefault": lambda d: d.setdefault("k", 1),
    "update": lambda d: d.update(k=1),
}
_LIST_MUTATORS: dict[str, Callable[[Any], object]] = {
    "__setitem__": lambda v: v.__setitem__(0, 9),
    "__delitem__": lambda v: v.__delitem__(0),
    "__iadd__": lambda v: v.__iadd__([9]),
    "__imul__": lambda v: v.__imul__(2),
    "append": lambda v: v.append(9),
    "extend": lambda v: v.extend([9]),
    "insert": lambda v: v.insert(0, 9),
    "pop": lambda v: v.pop(),
    "remove": lambda v: v.remove(1),
    "clear": lambda v: v.clear(),
    "sort": lambda v: v.sort(),
    "reverse": lambda v: v.reverse(),
}


def _sample() -> Any:
    return freeze({"a": [1, 2, {"b": [3]}], "c": {"d": "e"}, "n": None, "f": 1.5, "t": True})


def _assert_deeply_frozen(value: Any) -> None:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            assert type(node) in (FrozenDict, SessionEvent), type(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            assert type(node) is FrozenList, type(node)
            stack.extend(node)
        else:
            assert node is None or type(node) in (bool, int, float, str), type(node)


# ------------------------------------------------------------------ immutability


def test_every_dict_mutator_is_guarded() -> None:
    """FrozenDict overrides every in-place mutator of dict."""
    assert set(_DICT_MUTATORS) <= set(vars(FrozenDict))
    mutating = {"__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem", "setdefault", "update"}
    assert mutating == set(_DICT_MUTATORS)


@pytest.mark.parametrize("name", sorted(_DICT_MUTATORS))
def test_frozen_dict_mutators_raise(name: str) -> None:
    """Each FrozenDict mutator raises TypeError and leaves the value unchanged."""
    value = FrozenDict({"a": 1, "b": 2})
    with pytest.raises(TypeError, match="immutable"):
        _DICT_MUTATORS[name](value)
    assert value == {"a": 1, "b": 2}


def test_frozen_dict_operator_forms_raise() -> None:
    """Statement forms (item assignment, del, |=) raise too; `|` returns a new plain dict."""
    value: Any = FrozenDict({"a": 1})
    with pytest.raises(TypeError):
        value["a"] = 2
    with pytest.raises(TypeError):
        del value["a"]
    with pytest.raises(TypeError):
        value |= {"b": 2}
    merged = value | {"b": 2}
    assert type(merged) is dict
    assert value == {"a": 1}


@pytest.mark.parametrize("name", sorted(_LIST_MUTATORS))
def test_frozen_list_mutators_raise(name: str) -> None:
    """Each FrozenList mutator raises TypeError and leaves the value unchanged."""
    assert name in vars(FrozenList)
    value = FrozenList([1, 2, 3])
    with pytest.raises(TypeError, match="immutable"):
        _LIST_MUTATORS[name](value)
    assert value == [1, 2, 3]


def test_frozen_list_statement_forms_raise() -> None:
    """Index and slice assignment, del, += and *= raise; `+` returns a new plain list."""
    value: Any = FrozenList([1, 2, 3])
    with pytest.raises(TypeError):
        value[0] = 9
    with pytest.raises(TypeError):
        value[0:2] = [9]
    with pytest.raises(TypeError):
        del value[0]
    with pytest.raises(TypeError):
        del value[0:2]
    with pytest.raises(TypeError):
        value += [4]
    with pytest.raises(TypeError):
        value *= 2
    assert type(value + [4]) is list  # noqa: RUF005 - the operator itself is under test
    assert value == [1, 2, 3]


def test_frozen_types_cannot_change_class_or_grow_attributes() -> None:
    """Neither __class__ assignment nor new attributes can turn a frozen value mutable."""
    for value in (FrozenDict({"a": 1}), FrozenList([1])):
        with pytest.raises(TypeError):
            value.__class__ = dict if isinstance(value, dict) else list  # type: ignore[assignment]
        with pytest.raises(AttributeError):
            value.extra = 1  # type: ignore[union-attr]


def test_frozen_values_equal_plain_containers_and_serialise_natively() -> None:
    """Frozen values compare equal to plain dict/list and orjson encodes them as such."""
    value = _sample()
    plain = {"a": [1, 2, {"b": [3]}], "c": {"d": "e"}, "n": None, "f": 1.5, "t": True}
    assert value == plain
    assert orjson.dumps(value) == orjson.dumps(plain)
    assert FrozenList([1]) == [1]


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copies_stay_frozen_and_equal(clone: Callable[[Any], Any]) -> None:
    """copy and deepcopy of frozen values are frozen and equal (immutability makes sharing safe)."""
    value = _sample()
    cloned = clone(value)
    assert cloned == value
    _assert_deeply_frozen(cloned)
    with pytest.raises(TypeError):
        cloned["a"].append(1)


def test_copy_of_a_container_holding_frozen_values_stays_frozen_inside() -> None:
    """deepcopy of a plain dict holding frozen values keeps the inner values frozen."""
    holder = {"inner": _sample()}
    cloned = copy.deepcopy(holder)
    _assert_deeply_frozen(cloned["inner"])


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip_stays_frozen_and_equal(protocol: int) -> None:
    """Every pickle protocol round-trips frozen values (and SessionEvent) as frozen, equal values."""
    value = _sample()
    restored = pickle.loads(pickle.dumps(value, protocol=protocol))
    assert restored == value
    _assert_deeply_frozen(restored)
    event = SessionEvent({"type": "turn/start", "seq": 0, "time": 1, "data": FrozenDict({"turn": 1})})
    back = pickle.loads(pickle.dumps(event, protocol=protocol))
    assert type(back) is SessionEvent
    assert back == event
    assert back.seq == 0
    with pytest.raises(TypeError):
        back["seq"] = 1


# ------------------------------------------------------------------ freeze / adopt / is_json


def test_freeze_copies_and_accepts_tuples() -> None:
    """freeze returns a deep frozen copy; tuples become FrozenList; the input is never shared."""
    inner = [1, 2]
    source = {"t": (1, (2, 3)), "l": inner}
    frozen: Any = freeze(source)
    assert frozen == {"t": [1, [2, 3]], "l": [1, 2]}
    _assert_deeply_frozen(frozen)
    inner.append(3)
    assert frozen["l"] == [1, 2]


def test_freeze_accepts_the_librarys_frozen_subclasses() -> None:
    """A SessionEvent nested in data is a library frozen type: accepted and copied as a FrozenDict."""
    event = SessionEvent({"type": "turn/start", "seq": 0, "time": 1, "data": FrozenDict({"turn": 1})})
    frozen: Any = freeze({"copied": event})
    assert frozen == {"copied": dict(event)}
    assert type(frozen["copied"]) is FrozenDict
    assert type(freeze(event)) is FrozenDict


def test_freeze_reads_frozen_subclasses_through_base_methods() -> None:
    """A FrozenDict subclass cannot misreport its contents to the walk by overriding items()."""

    class Liar(FrozenDict):
        def items(self) -> Any:
            return [("fake", 1)]

    assert freeze({"x": Liar({"real": 2})}) == {"x": {"real": 2}}


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, SAFE_INT_MAX, -SAFE_INT_MAX, 1.5, 0.0, 1e300, "", "snow \u2603 \U0001f600", [], {}],
)
def test_freeze_accepts_json_scalars_and_empties(value: Any) -> None:
    """Accepted scalars pass unchanged; empty containers become frozen empties."""
    assert freeze(value) == value
    assert is_json(value)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (float("nan"), "$"),
        ({"a": [1, float("inf")]}, "$.a[1]"),
        ({"a": -0.0}, "$.a"),
        ([2**53], "$[0]"),
        ({"a": {1: 2}}, "$.a"),
        ({"a": {"\ud800": 2}}, "$.a"),
        (["\udc00"], "$[0]"),
        ({"k": b"x"}, "$.k"),
        ({"k": {1, 2}}, "$.k"),
        ({"a\nb": {"c": object()}}, '$["a\\nb"].c'),
    ],
)
def test_freeze_and_is_json_refuse_with_paths(value: Any, path: str) -> None:
    """Refusals carry code NOT_JSON and the JSON path; is_json agrees."""
    with pytest.raises(NotJsonError) as caught:
        freeze(value)
    assert caught.value.code == "NOT_JSON"
    assert isinstance(caught.value, DshError)
    assert caught.value.path == path
    assert path in caught.value.message
    assert not is_json(value)


def test_freeze_custom_path_and_depth() -> None:
    """freeze reports paths under a caller-given root and honours a smaller max_depth."""
    with pytest.raises(NotJsonError) as caught:
        freeze({"x": [[1]]}, max_depth=2, path="$.data")
    assert caught.value.path == "$.data.x[0]"
    assert freeze({"x": [1]}, max_depth=2) == {"x": [1]}


def test_freeze_handles_100000_deep_nesting_without_recursion_error() -> None:
    """A 100,000-deep value is refused cleanly at the cap and is_json says False."""
    value: Any = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(NotJsonError) as caught:
        freeze(value)
    assert caught.value.path == "$" + "[0]" * MAX_DEPTH
    assert not is_json(value)


def test_freeze_falls_back_when_the_stack_is_nearly_exhausted() -> None:
    """freeze still succeeds when the caller is deep in the stack (the fast walk yields to the iterative one)."""
    value: Any = 0
    for _ in range(150):
        value = [value]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 40)
    try:
        frozen = freeze(value)
    finally:
        sys.setrecursionlimit(limit)
    assert frozen == value


def test_adopt_read_rules() -> None:
    """adopt tolerates 64-bit integers, reads -0.0 as 0.0 and refuses integers beyond 64 bits."""
    parsed = orjson.loads(b'{"big": 9007199254740993, "min": -9223372036854775808, "z": -0.0}')
    adopted: Any = adopt(parsed)
    assert adopted["big"] == 2**53 + 1
    assert adopted["min"] == -(2**63)
    assert math.copysign(1.0, adopted["z"]) == 1.0
    _assert_deeply_frozen(adopted)
    with pytest.raises(NotJsonError) as caught:
        adopt(orjson.loads(b'{"u64": 18446744073709551615}'))
    assert caught.value.path == "$.u64"
    with pytest.raises(NotJsonError):
        freeze(adopted)  # writing a tolerated 64-bit integer stays refused


def test_adopt_root_class() -> None:
    """adopt can build a FrozenDict subclass at the root (the stored-event path)."""
    event = adopt(orjson.loads(b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}'), root=SessionEvent)
    assert type(event) is SessionEvent
    assert type(event["data"]) is FrozenDict


def test_loads_and_dumps() -> None:
    """dumps is compact, keeps key order and never emits a raw newline; loads adopts."""
    value = freeze({"z": "line\nbreak", "a": [1, 2.5, None, True], "m": {"\u2603": "\U0001f600"}})
    text = dumps(value)
    assert b"\n" not in text
    assert text.startswith(b'{"z":"line\\nbreak","a":[1,2.5,null,true]')
    assert loads(text) == value
    assert loads(text.decode()) == value
    _assert_deeply_frozen(loads(text))
    with pytest.raises(orjson.JSONDecodeError):
        loads(b'["\\ud800"]')


def test_thaw_returns_plain_mutable_deep_copies() -> None:
    """thaw gives plain dicts and lists at every level, including for a SessionEvent."""
    value = _sample()
    plain = thaw(value)
    assert plain == value
    assert type(plain) is dict
    assert type(plain["a"]) is list
    assert type(plain["a"][2]) is dict
    plain["a"][2]["b"].append(4)
    assert value["a"][2]["b"] == [3]  # type: ignore[index,call-overload]
    event = SessionEvent({"type": "x", "seq": 0, "time": 1, "data": FrozenDict({"k": FrozenList([1])})})
    thawed = thaw(event)
    assert type(thawed) is dict
    assert type(thawed["data"]["k"]) is list
    assert thaw(5) == 5
    assert thaw("s") == "s"


@pytest.mark.slow
def test_thaw_is_iterative() -> None:
    """thaw copes with nesting far deeper than the recursion limit."""
    value: Any = FrozenList()
    for _ in range(50_000):
        value = FrozenList([value])
    plain = thaw(value)
    depth = 0
    while plain:
        assert type(plain) is list
        plain = plain[0]
        depth += 1
    assert depth == 50_000


def test_is_safe_int() -> None:
    """Safe ints are real ints (not bools) within ±(2**53 - 1)."""
    assert is_safe_int(0)
    assert is_safe_int(SAFE_INT_MAX)
    assert is_safe_int(-SAFE_INT_MAX)
    assert not is_safe_int(SAFE_INT_MAX + 1)
    assert not is_safe_int(True)
    assert not is_safe_int(1.0)


# ------------------------------------------------------------------ properties

_FLOATS = st.floats(allow_nan=False, allow_infinity=False).map(lambda f: 0.0 if f == 0.0 else f)
_SCALARS = st.none() | st.booleans() | st.integers(-SAFE_INT_MAX, SAFE_INT_MAX) | _FLOATS | st.text(max_size=20)
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=40,
)
_WITH_TUPLES = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)


def _lists_for_tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists_for_tuples(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists_for_tuples(v) for v in value]
    return value


@settings(max_examples=examples(300), deadline=None)
@given(_JSON)
def test_property_freeze_dumps_loads_round_trip(value: Any) -> None:
    """freeze → dumps → loads returns an equal, deeply frozen value for any accepted JSON value."""
    frozen = freeze(value)
    back = loads(dumps(frozen))
    assert back == frozen == value
    _assert_deeply_frozen(frozen)
    _assert_deeply_frozen(back)


@settings(max_examples=examples(300), deadline=None)
@given(_JSON)
def test_property_thaw_inverts_freeze(value: Any) -> None:
    """thaw(freeze(x)) == x, with only plain containers."""
    thawed = thaw(freeze(value))
    assert thawed == value
    stack = [thawed]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            assert type(node) is dict
            stack.extend(node.values())
        elif isinstance(node, list):
            assert type(node) is list
            stack.extend(node)


@settings(max_examples=examples(300), deadline=None)
@given(_JSON)
def test_property_adopt_of_parsed_text_equals_freeze(value: Any) -> None:
    """adopt(orjson.loads(text of x)) equals freeze(x)."""
    assert adopt(orjson.loads(orjson.dumps(value))) == freeze(value)


@settings(max_examples=examples(200), deadline=None)
@given(_WITH_TUPLES)
def test_property_tuples_freeze_as_arrays(value: Any) -> None:
    """Tuples are accepted and become arrays; the result equals the list-normalised input."""
    frozen = freeze(value)
    assert frozen == _lists_for_tuples(value)
    _assert_deeply_frozen(frozen)


@settings(max_examples=examples(300), deadline=None)
@given(_WITH_TUPLES)
def test_property_fast_walk_equals_exact_walk(value: Any) -> None:
    """The recursive fast walk and the iterative exact walk produce identical values and types."""
    fast = freeze(value)
    exact = _convert(value, "$", MAX_DEPTH, _MODE_FREEZE)
    assert fast == exact
    assert orjson.dumps(fast) == orjson.dumps(exact)
    _assert_deeply_frozen(exact)
    assert is_json(value)
