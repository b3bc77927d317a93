"""Lazily frozen JSON views: every public path hands out frozen children; they read like the parsed value."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._lazy_json import LazyFrozenDict, LazyFrozenList
from dsh.json import SAFE_INT_MAX, FrozenDict, FrozenList, freeze, thaw
from tests.helpers import examples

_TEXT = b'{"a":{"b":[1,{"c":2}]},"l":[[1],{"x":1}],"s":"t","n":null,"f":1.5}'


def _view() -> Any:
    return LazyFrozenDict(orjson.loads(_TEXT))


def _assert_frozen_all_the_way(value: Any) -> None:
    """Walk `value` through its public API only; every container reached must be a frozen type."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            assert isinstance(node, FrozenDict), type(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            assert isinstance(node, FrozenList), type(node)
            stack.extend(node)


def test_lazy_views_read_like_the_parsed_value_and_serialise_the_same() -> None:
    """A view equals the parsed value, and orjson and json encode it byte for byte the same."""
    parsed = orjson.loads(_TEXT)
    view = _view()
    assert view == parsed
    assert orjson.dumps(view) == orjson.dumps(parsed)
    assert json.dumps(view) == json.dumps(parsed)
    assert view["a"]["b"][1]["c"] == 2
    assert view.get("missing", 7) == 7
    _assert_frozen_all_the_way(view)
    assert view == parsed


def test_each_access_returns_the_same_frozen_child() -> None:
    """Indexing wraps a child once and keeps the wrapper, so repeated access is the same object."""
    view = _view()
    assert view["a"] is view["a"]
    assert view.get("a") is view["a"]
    assert view["l"][0] is view["l"][0]
    assert type(view["a"]) is LazyFrozenDict
    assert type(view["l"]) is LazyFrozenList


def _kwargs(**values: Any) -> dict[str, Any]:
    return values


def _updated(view: Any) -> dict[str, Any]:
    target: dict[str, Any] = {}
    target.update(view)
    return target


def _matched(value: Any) -> Any:
    match value:
        case {"a": inner}:
            return inner
    return None


_DICT_PATHS: dict[str, Callable[[Any], Any]] = {
    "dict()": lambda v: dict(v)["a"],
    "{**}": lambda v: {**v}["a"],
    "**kwargs": lambda v: _kwargs(**v)["a"],
    "update": lambda v: _updated(v)["a"],
    "|": lambda v: (v | {})["a"],
    "reflected |": lambda v: ({} | v)["a"],
    "copy()": lambda v: v.copy()["a"],
    "values()": lambda v: next(iter(v.values())),
    "items()": lambda v: dict(v.items())["a"],
    "get": lambda v: v.get("a"),
    "match": _matched,
}


@pytest.mark.parametrize("path", sorted(_DICT_PATHS))
def test_every_way_out_of_a_dict_view_hands_out_frozen_children(path: str) -> None:
    """Copies, merges, unpacking, iteration and matching never hand out a plain child."""
    child = _DICT_PATHS[path](_view())
    assert isinstance(child, FrozenDict), type(child)
    _assert_frozen_all_the_way(child)


def _first_of_two(first: Any, second: Any) -> Any:
    return first


# The operators themselves are under test, so the spelled-out forms stay (RUF005, RUF015).
_LIST_PATHS: dict[str, Callable[[Any], Any]] = {
    "iter": lambda v: next(iter(v)),
    "list()": lambda v: list(v)[0],  # noqa: RUF015
    "tuple()": lambda v: tuple(v)[0],  # noqa: RUF015
    "unpack": lambda v: _first_of_two(*v),
    "star": lambda v: [*v][0],  # noqa: RUF015
    "slice": lambda v: v[:][0],
    "+": lambda v: (v + [])[0],  # noqa: RUF005
    "reflected +": lambda v: ([] + v)[0],  # noqa: RUF005
    "*": lambda v: (v * 2)[2],
    "reflected *": lambda v: (2 * v)[2],
    "reversed": lambda v: list(reversed(v))[1],
    "copy()": lambda v: v.copy()[0],
}


@pytest.mark.parametrize("path", sorted(_LIST_PATHS))
def test_every_way_out_of_a_list_view_hands_out_frozen_items(path: str) -> None:
    """Iteration, unpacking, slices, concatenation, repetition and copies never hand out a plain item."""
    item = _LIST_PATHS[path](_view()["l"])
    assert isinstance(item, FrozenList), type(item)
    _assert_frozen_all_the_way(item)


def test_lazy_views_refuse_every_mutation() -> None:
    """Item assignment, deletion, in-place operators and mutating methods raise TypeError."""
    view = _view()
    items = view["l"]
    attempts: list[Callable[[], object]] = [
        lambda: view.__setitem__("a", 1),
        lambda: view.__delitem__("a"),
        lambda: view.update(k=1),
        lambda: view.pop("a"),
        lambda: view.setdefault("k", 1),
        view.clear,
        lambda: view["a"].__setitem__("b", 1),
        lambda: items.append(1),
        lambda: items.__setitem__(0, 1),
        lambda: items[0].append(2),
        items.sort,
    ]
    for attempt in attempts:
        with pytest.raises(TypeError):
            attempt()
    assert view == orjson.loads(_TEXT)


def test_a_view_cannot_change_class_or_grow_attributes() -> None:
    """Class assignment (which would skip the wrapping) and new attributes are refused."""
    view = _view()
    with pytest.raises(TypeError):
        view.__class__ = FrozenDict
    with pytest.raises(TypeError):
        view["l"].__class__ = FrozenList
    with pytest.raises(TypeError):
        view.extra = 1
    assert type(view) is LazyFrozenDict


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copies_of_a_view_are_frozen_and_equal(clone: Callable[[Any], Any]) -> None:
    """copy and deepcopy of a view share it (it is immutable) and stay frozen all the way."""
    view = _view()
    cloned = clone(view)
    assert cloned == view
    _assert_frozen_all_the_way(cloned)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickled_views_come_back_frozen_and_equal(protocol: int) -> None:
    """Every pickle protocol round-trips a view as an equal value frozen all the way."""
    restored = pickle.loads(pickle.dumps(_view(), protocol=protocol))
    assert restored == orjson.loads(_TEXT)
    _assert_frozen_all_the_way(restored)


def test_freeze_and_thaw_accept_views() -> None:
    """freeze copies a view into plain frozen types; thaw gives plain mutable copies."""
    frozen: Any = freeze({"kept": _view()})
    assert frozen == {"kept": orjson.loads(_TEXT)}
    assert type(frozen["kept"]) is FrozenDict
    assert type(frozen["kept"]["a"]) is FrozenDict
    plain = thaw(_view())
    assert plain == orjson.loads(_TEXT)
    assert type(plain["a"]["b"]) is list


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-SAFE_INT_MAX, SAFE_INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0.0)
    | st.text(max_size=8)
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.text(max_size=6), _JSON, max_size=5))
def test_property_a_view_of_parsed_text_equals_freeze_and_is_frozen_all_the_way(value: dict[str, Any]) -> None:
    """For any JSON object, the view of its parsed text equals freeze(value), encodes the same and is deeply frozen."""
    view = LazyFrozenDict(orjson.loads(orjson.dumps(value)))
    frozen = freeze(value)
    assert view == frozen
    assert orjson.dumps(view) == orjson.dumps(frozen)
    _assert_frozen_all_the_way(view)
    assert thaw(view) == value
