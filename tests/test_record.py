"""`dsh._record.Record`: the immutable records the start-up path defines instead of dataclasses.

A record behaves like a frozen, slotted dataclass: value equality within its class, a hash, a
`Name(field=value)` repr, pickling and copying, and no assignment after construction.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from dsh._record import Record, set_fields


class _Point(Record):
    __slots__ = ("label", "x", "y")
    x: int
    y: int
    label: str | None

    def __init__(self, x: int, y: int, label: str | None = None) -> None:
        set_fields(self, x, y, label)


class _Other(Record):
    __slots__ = ("x", "y")
    x: int
    y: int

    def __init__(self, x: int, y: int) -> None:
        set_fields(self, x, y)


def test_fields_follow_the_annotations_in_declaration_order() -> None:
    """`_FIELDS` is the class's own annotations in order, whatever order `__slots__` lists them in."""
    assert _Point._FIELDS == ("x", "y", "label")
    assert repr(_Point(1, 2)) == "_Point(x=1, y=2, label=None)"


def test_equality_and_hash_are_by_value_within_one_class() -> None:
    """Equal fields make equal records with equal hashes; another record class never compares equal."""
    assert _Point(1, 2, "a") == _Point(1, 2, "a")
    assert hash(_Point(1, 2, "a")) == hash(_Point(1, 2, "a"))
    assert _Point(1, 2) != _Point(1, 3)
    assert _Other(1, 2) != _Point(1, 2)
    assert _Other(1, 2) != (1, 2)


def test_fields_cannot_be_assigned_or_deleted() -> None:
    """Assignment and deletion raise `FrozenInstanceError`, as they do on a frozen dataclass."""
    point = _Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.y
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.extra = 1  # type: ignore[attr-defined]
    assert point == _Point(1, 2)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_records_survive_pickling(protocol: int) -> None:
    """Every pickle protocol rebuilds an equal record."""
    point = _Point(1, 2, "a")
    assert pickle.loads(pickle.dumps(point, protocol)) == point


def test_copies_are_equal_and_replace_runs_the_constructor() -> None:
    """`copy`, `deepcopy` and `_replace` give equal or changed records; `_replace` keeps the other fields."""
    point = _Point(1, 2, "a")
    assert copy.copy(point) == point
    assert copy.deepcopy(point) == point
    assert point._replace(y=5) == _Point(1, 5, "a")
    with pytest.raises(TypeError):
        point._replace(z=1)
