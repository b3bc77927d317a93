"""The lossless JSON boundary: validate, deep-freeze, encode and decode.

Layer: base. Every value that enters a session (event data, surface metadata, header fields) crosses
`freeze` once: one iterative pass that validates and copies, so nothing a caller keeps can change a
committed event, and nothing that would not survive a JSON round trip (NaN, -0.0, sets, cycles,
non-string keys, integers a JavaScript reader would round) is ever stored. The output is deeply
immutable: objects become `FrozenDict`, arrays `FrozenList`; both are `dict`/`list` subclasses that
`orjson` serialises natively and that compare equal to plain containers. Stored logs are parsed with
`orjson` and passed through `adopt`, which applies the read-side rules (tolerated 64-bit integers,
`-0.0` read as `0.0`).
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
        self.items: Iterator[Any] = iter(src.items()) if self.is_dict else iter(src)
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
        lo, hi = (_I64_MIN, _I64_MAX) if mode == _MODE_ADOPT else (-SAFE_INT_MAX, SAFE_INT_MAX)
        if lo <= value <= hi:  # type: ignore[operator]
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


def _convert(value: object, path: str, max_depth: int, mode: int, root: type[FrozenDict] = FrozenDict) -> JsonValue:
    """The one iterative walk behind `freeze`, `adopt` and `is_json` (no recursion, any depth)."""
    if type(value) not in _CONTAINERS:
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
        elif ct in _CONTAINERS:
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


def freeze(value: object, *, max_depth: int = MAX_DEPTH, path: str = "$") -> JsonValue:
    """Validate borrowed input and return a deeply immutable copy.

    Args:
        value: Any Python value; only plain JSON types (and the frozen ones) are accepted.
        max_depth: Container nesting allowed below and including `value`.
        path: JSON path of `value`, used in error messages.

    Raises:
        NotJsonError: The first offending value, with its JSON path.
    """
    return _convert(value, path, max_depth, _MODE_FREEZE)


def adopt(parsed: object, *, path: str = "$", root: type[FrozenDict] = FrozenDict) -> JsonValue:
    """Freeze freshly parsed data under the read-side rules.

    Integers within signed 64 bits are tolerated (a foreign writer may store them) and `-0.0` reads
    as `0.0`. No depth cap applies: the parser already bounded it. `root` chooses the class of a
    top-level object (a `FrozenDict` subclass such as `SessionEvent`), saving one copy.
    """
    return _convert(parsed, path, 1 << 30, _MODE_ADOPT, root)


def is_json(value: object) -> bool:
    """True when `freeze(value)` would succeed."""
    try:
        _convert(value, "$", MAX_DEPTH, _MODE_CHECK)
    except NotJsonError:
        return False
    return True


def thaw(value: JsonValue) -> Any:
    """Return a plain, mutable deep copy (dicts and lists) of a JSON value."""
    t = type(value)
    if t is not FrozenDict and t is not FrozenList and t is not dict and t is not list:
        return value
    root: dict[str, Any] | list[Any] = {} if isinstance(value, dict) else []
    source: Iterable[Any] = value.items() if isinstance(value, dict) else value  # type: ignore[assignment]
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
