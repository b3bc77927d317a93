"""`Record`: the base of small immutable records that every start of the library defines.

Layer: base (imports nothing from dsh). `@dataclass(frozen=True, slots=True)` writes and compiles
six methods for every class when its module is imported (about half a millisecond each class), and
a `typing.NamedTuple` compiles one expression per string annotation; a start that defines dozens
of them pays for it (docs/architecture.md#import-cost). A `Record` subclass writes its fields out
instead and inherits the rest:

* class annotations declare the fields in constructor order (`_FIELDS` is taken from them),
  `__slots__` holds them, and `__init__` stores them with `set_fields(self, value, ...)`;
* `Record` gives value equality (same class only), a hash, a `Name(field=value, ...)` repr,
  pickling and copying (which set the fields again without `__init__`), `_replace(**changes)`
  (which runs `__init__`, so its checks too), and `dataclasses.FrozenInstanceError` on any
  assignment or deletion.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from typing import Any, ClassVar, Self, cast

__all__ = ["Record", "set_fields"]

_set = object.__setattr__


def set_fields(record: Record, *values: object) -> None:
    """Store `values` in `record`'s fields, in `_FIELDS` order (`__init__` only)."""
    for name, value in zip(record._FIELDS, values, strict=True):  # noqa: SLF001  # the record's own table
        _set(record, name, value)


def _rebuild(cls: type[Record], values: tuple[object, ...]) -> Record:
    """Unpickle (and copy) a record: its fields set again as they were, without running `__init__`."""
    record = object.__new__(cls)
    set_fields(record, *values)
    return record


class Record:
    """Immutability, equality, hashing, a repr, pickling and `_replace` over `_FIELDS`."""

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._FIELDS = tuple(inspect.get_annotations(cls))  # its own fields, in order, unevaluated

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def _replace(self, **changes: Any) -> Self:
        """A copy with `changes` applied, built through `__init__` (so its checks run again)."""
        values = dict(zip(self._FIELDS, self._values(), strict=True))
        values.update(changes)
        rebuilt: Self = cast(Any, type(self))(**values)
        return rebuilt

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"{type(self).__qualname__}({fields})"

    def __reduce__(self) -> tuple[Callable[[type[Record], tuple[object, ...]], Record], tuple[object, ...]]:
        return _rebuild, (type(self), self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")
