"""Lazily frozen JSON: read-only containers over freshly parsed JSON that freeze each child on access.

Layer: base. A stored log is parsed once and handed out as deeply immutable events. Copying every
nested container of every event into `FrozenDict`/`FrozenList` up front (`dsh.json.adopt`) costs
more than parsing it, so the read path wraps parsed data in the views below instead, and the cost
follows what a reader touches (docs/architecture.md#read-path).

`LazyFrozenDict` and `LazyFrozenList` are `FrozenDict` and `FrozenList` subclasses: the same
mutators raise, equality is plain `dict`/`list` equality and `orjson` serialises them natively. Their
storage may still hold the parsed, plain children; every public way to reach a child hands it out
wrapped in a view (a copy of its top level) and keeps that view in place of the plain child, so each
access returns the same immutable object and no plain container ever leaves. The caller's own plain
containers are never changed: wrapping copies, it never changes an object's type.

* indexing and `get` wrap the one child asked for;
* iterating values or items (`values()`, `items()`, iterating a list), copies, `|`, `+`, `*`,
  slices and `reversed` first wrap every child ("settle") and then use the fast built-in code;
* `dict(view)`, `{**view}`, `f(**view)` and `update(view)` go through `keys()` and indexing,
  because the dict view defines `__iter__` (CPython copies a dict subclass's storage directly
  only when it keeps `dict.__iter__`);
* equality, `len`, `in`, `repr`, `index`/`count` and `orjson.dumps` read the storage directly,
  which is safe: they only read;
* class assignment is refused, so a view cannot be turned into a plain frozen type whose
  indexing would skip the wrapping.

Calling a base-class method on purpose (`dict.__getitem__(view, key)`) reaches the storage, just as
`dict.__setitem__(frozen, key, value)` reaches a `FrozenDict`'s: immutability guards the library's
API, not deliberate circumvention.

Only data the read rules accept unchanged may be wrapped: freshly parsed by `orjson` (valid UTF-8,
finite numbers), with no integer outside signed 64 bits and no `-0.0` (which `adopt` rewrites as
`0.0`), handed over by its only owner. `dsh.session.stored` wraps only the records of a load the
backend declares viewable (the JSONL scanner checks each slice for both); everything else goes to
`adopt`.
"""

from __future__ import annotations

from typing import Any, NoReturn, SupportsIndex

from dsh.json import FrozenDict, FrozenList, JsonValue

__all__ = ["LazyFrozenDict", "LazyFrozenList"]

_dict_getitem = dict.__getitem__
_dict_setitem = dict.__setitem__
_dict_items = dict.items
_list_getitem = list.__getitem__
_list_setitem = list.__setitem__
_list_iter = list.__iter__


def _refuse_attribute(self: object, *args: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable")


class LazyFrozenDict(FrozenDict):
    """A read-only JSON object whose plain children are wrapped in views when they are reached."""

    __slots__ = ()

    __setattr__ = _refuse_attribute
    __delattr__ = _refuse_attribute

    def __getitem__(self, key: str) -> JsonValue:
        value: Any = _dict_getitem(self, key)
        cls = value.__class__
        if cls is dict or cls is list:
            value = LazyFrozenDict(value) if cls is dict else LazyFrozenList(value)
            _dict_setitem(self, key, value)
        return value  # type: ignore[no-any-return]

    def get(self, key: str, default: Any = None) -> Any:
        """The child under `key` (wrapped), or `default`."""
        if key in self:
            return self[key]
        return default

    def _settle(self) -> None:
        """Wrap every plain child in place; afterwards the storage holds only frozen values."""
        plain = [key for key, value in _dict_items(self) if value.__class__ is dict or value.__class__ is list]
        for key in plain:
            self[key]

    def __iter__(self) -> Any:
        # Keys only, so nothing to wrap; defining it makes dict(view) and {**view} use indexing.
        return dict.__iter__(self)

    def values(self) -> Any:
        """The values, every child frozen."""
        self._settle()
        return dict.values(self)

    def items(self) -> Any:
        """The items, every child frozen."""
        self._settle()
        return _dict_items(self)

    def copy(self) -> dict[str, JsonValue]:
        """A plain shallow copy (like `FrozenDict.copy`), holding frozen children."""
        self._settle()
        return dict.copy(self)

    def __or__(self, other: Any) -> Any:
        self._settle()
        return dict.__or__(self, other)

    def __ror__(self, other: Any) -> Any:
        self._settle()
        return dict.__ror__(self, other)


class LazyFrozenList(FrozenList):
    """A read-only JSON array whose plain items are wrapped in views when they are reached."""

    __slots__ = ()

    __setattr__ = _refuse_attribute
    __delattr__ = _refuse_attribute

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        if index.__class__ is int:
            value: Any = _list_getitem(self, index)
            cls = value.__class__
            if cls is dict or cls is list:
                value = LazyFrozenDict(value) if cls is dict else LazyFrozenList(value)
                _list_setitem(self, index, value)
            return value
        self._settle()
        return _list_getitem(self, index)

    def _settle(self) -> None:
        """Wrap every plain item in place; afterwards the storage holds only frozen values."""
        plain = [
            index for index, value in enumerate(_list_iter(self)) if value.__class__ is dict or value.__class__ is list
        ]
        for index in plain:
            self[index]

    def __iter__(self) -> Any:
        self._settle()
        return _list_iter(self)

    def __reversed__(self) -> Any:
        self._settle()
        return list.__reversed__(self)

    def copy(self) -> list[JsonValue]:
        """A plain shallow copy (like `FrozenList.copy`), holding frozen items."""
        self._settle()
        return list.copy(self)

    def __add__(self, other: Any) -> Any:
        self._settle()
        return list.__add__(self, other)

    def __radd__(self, other: Any) -> Any:
        # `plain + view`: Python asks the subclass first; once settled, the built-in concatenation
        # (which reads the storage directly) may proceed.
        self._settle()
        return NotImplemented

    def __mul__(self, count: SupportsIndex) -> Any:
        self._settle()
        return list.__mul__(self, count)

    def __rmul__(self, count: SupportsIndex) -> Any:
        self._settle()
        return list.__mul__(self, count)
