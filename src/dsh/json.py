"""The lossless JSON boundary: validate, deep-freeze, encode and decode.

Layer: base. Every value that enters a session (event data, surface metadata, header fields) crosses
`freeze` once: one iterative pass that validates and copies, so nothing a caller keeps can change a
committed event, and nothing that would not survive a JSON round trip (NaN, -0.0, sets, cycles,
non-string keys, integers a JavaScript reader would round) is ever stored. The output is deeply
immutable: objects become `FrozenDict`, arrays `FrozenList`; both are `dict`/`list` subclasses that
`orjson` serialises natively and that compare equal to plain containers. Stored logs are parsed with
`orjson` and passed through `adopt`, which applies the read-side rules (tolerated 64-bit integers,
`-0.0` read as `0.0`).

Both `freeze` (the append hot path) and `adopt` (the read hot path) first try a recursive walk
that keeps no paths; anything it does not accept outright (a refusal, an unusual type, nesting past
200 levels, a caller already deep in the stack) is re-walked by the exact iterative walk, which
handles any depth and words the error with its JSON path. Accepted input gives the same value both
ways (a property test checks it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, Final, NoReturn, TypeAlias

import orjson

from dsh.errors import DshError

__all__ = [
    "MAX_DEPTH",
    "SAFE_INT_MAX",
    "FrozenDict",
    "FrozenList",
    "JsonValue",
    "NotJsonError",
    "adopt",
    "dumps",
    "freeze",
    "is_json",
    "is_safe_int",
    "loads",
    "thaw",
]

MAX_DEPTH: Final = 200
"""Deepest container nesting `freeze` accepts (orjson cannot encode much deeper than 255)."""

SAFE_INT_MAX: Final = 2**53 - 1
"""Largest integer a JavaScript reader represents exactly; writes are confined to ±SAFE_INT_MAX."""

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

JsonValue: TypeAlias = "bool | int | float | str | FrozenList | FrozenDict | None"


class NotJsonError(DshError, ValueError):
    """A value is not lossless JSON. `path` is a JSON path such as `$.message.content[2]`."""

    codes = frozenset({"NOT_JSON"})

    def __init__(self, message: str, *, path: str, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


def _immutable(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable")


class FrozenDict(dict[str, "JsonValue"]):
    """A read-only JSON object. Mutators raise `TypeError`; equality is plain `dict` equality."""

    __slots__ = ()

    __setitem__ = _immutable
    __delitem__ = _immutable
    __ior__ = _immutable
    clear = _immutable
    pop = _immutable
    popitem = _immutable
    setdefault = _immutable
    update = _immutable

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, JsonValue]]]:
        return (type(self), (dict(self),))


class FrozenList(list["JsonValue"]):
    """A read-only JSON array. Mutators raise `TypeError`; equality is plain `list` equality."""

    __slots__ = ()

    __setitem__ = _immutable
    __delitem__ = _immutable
    __iadd__ = _immutable
    __imul__ = _immutable
    append = _immutable
    extend = _immutable
    insert = _immutable
    pop = _immutable
    remove = _immutable
    clear = _immutable
    sort = _immutable
    reverse = _immutable

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenList:
        return self

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[JsonValue]]]:
        return (type(self), (list(self),))


EMPTY_DICT: Final = FrozenDict()
EMPTY_LIST: Final = FrozenList()


def is_safe_int(value: object) -> bool:
    """True for a real `int` (not `bool`) within ±(2**53 - 1)."""
    return type(value) is int and -SAFE_INT_MAX <= value <= SAFE_INT_MAX


def _key_path(path: str, key: str) -> str:
    if key.isidentifier() and key.isascii():
        return f"{path}.{key}"
    return f"{path}[{orjson.dumps(key).decode()}]"


def _valid_str(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Frame:
    """One container being converted: its items, the output under construction, its path."""

    __slots__ = ("index", "is_dict", "items", "key", "out", "path", "src")

    def __init__(self, src: Any, path: str, build: bool) -> None:
        self.src = src
        self.path = path
        self.is_dict = isinstance(src, dict)
        # Base-class iteration: a FrozenDict/FrozenList subclass cannot misreport its contents.
        self.items: Iterator[Any]
        if self.is_dict:
            self.items = iter(dict.items(src))
        else:
            self.items = list.__iter__(src) if isinstance(src, list) else iter(src)
        self.out: Any = ({} if self.is_dict else []) if build else None
        self.key: str = ""
        self.index = -1

    def child_path(self) -> str:
        return _key_path(self.path, self.key) if self.is_dict else f"{self.path}[{self.index}]"


_MODE_FREEZE: Final = 0
_MODE_ADOPT: Final = 1
_MODE_CHECK: Final = 2

_DONE: Final = object()
_CONTAINERS: Final = frozenset({dict, list, tuple, FrozenDict, FrozenList})
_NO_DEPTH_CAP: Final = 1 << 30


def _fail(path: str, reason: str) -> NoReturn:
    raise NotJsonError(f"value is not lossless JSON at {path}: {reason}", path=path, reason=reason)


def _scalar_problem(value: object, mode: int) -> tuple[str | None, object]:
    """Check one non-container value: `(problem, value to store)`; problem is None when valid."""
    t = type(value)
    if value is None or t is bool:
        return None, value
    if t is str:
        return (None if _valid_str(value) else "string holds a lone surrogate"), value  # type: ignore[arg-type]
    if t is int:
        if mode == _MODE_ADOPT:
            if _I64_MIN <= value <= _I64_MAX:  # type: ignore[operator]
                return None, value
            return f"integer {value} is outside the signed 64-bit range", value
        if -SAFE_INT_MAX <= value <= SAFE_INT_MAX:  # type: ignore[operator]
            return None, value
        return f"integer {value} is outside the safe range \u00b1(2**53-1)", value
    if t is float:
        f: float = value  # type: ignore[assignment]
        if not math.isfinite(f):
            return f"{f} is not a finite number", value
        if f == 0.0 and math.copysign(1.0, f) < 0:
            if mode == _MODE_ADOPT:
                return None, 0.0
            return "-0.0 does not survive a JSON round trip", value
        return None, f
    return f"{t.__name__} is not a JSON type", value


def _is_container(value: object) -> bool:
    # The library's frozen types count even when subclassed (a `SessionEvent` is a `FrozenDict`).
    return type(value) in _CONTAINERS or isinstance(value, FrozenDict | FrozenList)


def _convert(value: object, path: str, max_depth: int, mode: int, root: type[FrozenDict] = FrozenDict) -> JsonValue:
    """The exact walk behind `freeze`, `adopt` and `is_json`: iterative (any depth), with JSON paths.

    `freeze` and `adopt` try the recursive fast walk first and come here only when it declines.
    """
    if not _is_container(value):
        problem, scalar = _scalar_problem(value, mode)
        if problem is not None:
            _fail(path, problem)
        return scalar  # type: ignore[return-value]
    if max_depth < 1:
        _fail(path, f"nesting exceeds {MAX_DEPTH} levels")
    build = mode != _MODE_CHECK
    stack = [_Frame(value, path, build)]
    ancestors = {id(value)}
    while True:
        frame = stack[-1]
        item: Any = next(frame.items, _DONE)
        if item is _DONE:
            stack.pop()
            ancestors.discard(id(frame.src))
            done: Any = None
            if build:
                container = (root if not stack else FrozenDict) if frame.is_dict else FrozenList
                done = container(frame.out)
            if not stack:
                return done  # type: ignore[no-any-return]
            parent = stack[-1]
            if build:
                if parent.is_dict:
                    parent.out[parent.key] = done
                else:
                    parent.out.append(done)
            continue
        key: Any
        child: Any
        if frame.is_dict:
            key, child = item
            frame.key = key
            if type(key) is not str:
                _fail(frame.path, f"object key {key!r} is not a string")
            if not _valid_str(key):
                _fail(frame.path, "object key holds a lone surrogate")
        else:
            child = item
            frame.index += 1
        ct = type(child)
        stored: Any
        if ct is str and child.isascii():
            stored = child
        elif _is_container(child):
            if id(child) in ancestors:
                _fail(frame.child_path(), "cycle: a container contains itself")
            if len(stack) >= max_depth:
                _fail(frame.child_path(), f"nesting exceeds {MAX_DEPTH} levels")
            ancestors.add(id(child))
            stack.append(_Frame(child, frame.child_path(), build))
            continue
        else:
            problem, stored = _scalar_problem(child, mode)
            if problem is not None:
                _fail(frame.child_path(), problem)
        if build:
            if frame.is_dict:
                frame.out[key] = stored
            else:
                frame.out.append(stored)


class _DeclinedError(Exception):
    """Internal signal: the fast walk met something only the exact walk can judge or word."""


_FAST_DEPTH: Final = MAX_DEPTH
"""Nesting the recursive fast walk handles; anything deeper goes to the iterative walk."""

_WRITE_RANGE: Final = (-SAFE_INT_MAX, SAFE_INT_MAX)
_READ_RANGE: Final = (_I64_MIN, _I64_MAX)


def _fast_dict(src: Any, budget: int, reading: bool, cls: type[FrozenDict]) -> FrozenDict:
    """Validate and copy one object, recursing for children; raise `_DeclinedError` on anything unusual.

    The fast walk carries no paths and no cycle bookkeeping: on a problem, an unusual type or
    nesting beyond `budget` (which is how a cycle shows up here) it gives up, and the exact,
    iterative walk reruns and reports. Accepted input yields exactly what the exact walk yields.
    """
    lo, hi = _READ_RANGE if reading else _WRITE_RANGE
    out: dict[str, Any] = {}
    for key, item in dict.items(src):
        if type(key) is not str or not (key.isascii() or _valid_str(key)):
            raise _DeclinedError
        t = type(item)
        value: Any = item
        if t is str:
            if not item.isascii() and not _valid_str(item):
                raise _DeclinedError
        elif t is dict or t is FrozenDict:
            if budget <= 1:
                raise _DeclinedError
            value = _fast_dict(item, budget - 1, reading, FrozenDict)
        elif t is list or t is FrozenList or t is tuple:
            if budget <= 1:
                raise _DeclinedError
            value = _fast_list(item, budget - 1, reading)
        elif t is int:
            if not lo <= item <= hi:
                raise _DeclinedError
        elif t is float:
            if not math.isfinite(item):
                raise _DeclinedError
            if item == 0.0 and math.copysign(1.0, item) < 0:
                if not reading:
                    raise _DeclinedError
                value = 0.0
        elif item is not None and t is not bool:
            raise _DeclinedError
        out[key] = value
    return cls(out)


def _fast_list(src: Any, budget: int, reading: bool) -> FrozenList:
    """The array half of `_fast_dict` (same contract)."""
    lo, hi = _READ_RANGE if reading else _WRITE_RANGE
    out: list[Any] = []
    append = out.append
    for item in src if type(src) is tuple else list.__iter__(src):
        t = type(item)
        value: Any = item
        if t is str:
            if not item.isascii() and not _valid_str(item):
                raise _DeclinedError
        elif t is dict or t is FrozenDict:
            if budget <= 1:
                raise _DeclinedError
            value = _fast_dict(item, budget - 1, reading, FrozenDict)
        elif t is list or t is FrozenList or t is tuple:
            if budget <= 1:
                raise _DeclinedError
            value = _fast_list(item, budget - 1, reading)
        elif t is int:
            if not lo <= item <= hi:
                raise _DeclinedError
        elif t is float:
            if not math.isfinite(item):
                raise _DeclinedError
            if item == 0.0 and math.copysign(1.0, item) < 0:
                if not reading:
                    raise _DeclinedError
                value = 0.0
        elif item is not None and t is not bool:
            raise _DeclinedError
        append(value)
    return FrozenList(out)


def _fast(value: object, max_depth: int, reading: bool, root: type[FrozenDict]) -> JsonValue:
    """Run the fast walk on a container, or raise `_DeclinedError`/`RecursionError` to defer to `_convert`."""
    budget = min(max_depth, _FAST_DEPTH)
    t = type(value)
    if t is dict or t is FrozenDict:
        return _fast_dict(value, budget, reading, root)
    return _fast_list(value, budget, reading)


def freeze(value: object, *, max_depth: int = MAX_DEPTH, path: str = "$") -> JsonValue:
    """Validate borrowed input and return a deeply immutable copy.

    Args:
        value: Any Python value; only plain JSON types (and the frozen ones) are accepted.
        max_depth: Container nesting allowed below and including `value`.
        path: JSON path of `value`, used in error messages.

    Raises:
        NotJsonError: The first offending value, with its JSON path.
    """
    # Common case first: a recursive walk without path bookkeeping (about 3x faster). Anything it
    # does not accept outright, including a caller already deep in the stack, reruns the exact walk.
    if max_depth >= 1 and type(value) in _CONTAINERS:
        try:
            return _fast(value, max_depth, False, FrozenDict)
        except (_DeclinedError, RecursionError):
            pass
    return _convert(value, path, max_depth, _MODE_FREEZE)


def adopt(parsed: object, *, path: str = "$", root: type[FrozenDict] = FrozenDict) -> JsonValue:
    """Freeze freshly parsed data under the read-side rules.

    Integers within signed 64 bits are tolerated (a foreign writer may store them) and `-0.0` reads
    as `0.0`. No depth cap applies: the parser already bounded it. `root` chooses the class of a
    top-level object (a `FrozenDict` subclass such as `SessionEvent`), saving one copy.
    """
    if type(parsed) in _CONTAINERS:
        try:
            return _fast(parsed, _NO_DEPTH_CAP, True, root)
        except (_DeclinedError, RecursionError):
            pass
    return _convert(parsed, path, _NO_DEPTH_CAP, _MODE_ADOPT, root)


def is_json(value: object) -> bool:
    """True when `freeze(value)` would succeed."""
    try:
        _convert(value, "$", MAX_DEPTH, _MODE_CHECK)
    except NotJsonError:
        return False
    return True


def thaw(value: JsonValue) -> Any:
    """Return a plain, mutable deep copy (dicts and lists) of a JSON value.

    Every object becomes a plain `dict` and every array a plain `list`, subclasses included (a
    `SessionEvent` thaws to a `dict`); scalars are returned as they are. Iterative, so any depth works.
    """
    if not isinstance(value, dict | list):
        return value
    root: dict[str, Any] | list[Any] = {} if isinstance(value, dict) else []
    source: Iterable[Any] = value.items() if isinstance(value, dict) else value
    stack: list[tuple[Iterable[Any], dict[str, Any] | list[Any]]] = [(source, root)]
    while stack:
        src, out = stack.pop()
        if isinstance(out, dict):
            for key, child in src:
                out[key] = _thaw_child(child, stack)
        else:
            out.extend(_thaw_child(child, stack) for child in src)
    return root


def _thaw_child(child: Any, stack: list[tuple[Iterable[Any], dict[str, Any] | list[Any]]]) -> Any:
    if isinstance(child, dict):
        copy: dict[str, Any] = {}
        stack.append((child.items(), copy))
        return copy
    if isinstance(child, list):
        items: list[Any] = []
        stack.append((child, items))
        return items
    return child


def dumps(value: JsonValue) -> bytes:
    """Encode compactly, keeping key order. The output never contains a raw newline."""
    return orjson.dumps(value)


def loads(data: bytes | bytearray | memoryview | str) -> JsonValue:
    """Parse JSON text and adopt it (read-side rules)."""
    return adopt(orjson.loads(data))


# Shown under the name users import (docs/architecture.md#public-names).
FrozenDict.__module__ = "dsh"
FrozenList.__module__ = "dsh"
NotJsonError.__module__ = "dsh"
