"""The strict shapes of the `subagent` and `subagentTiming` unit states and views, checked by hand.

Layer: subagent (private). Each schema accepts exactly its JSON shape — closed keys, `str`, `bool`
and `int` (never a `bool` or a float for an `int`), non-negative where the field is a count or a
`seq` — and returns a fresh `dict` with the keys in declaration order, raising `ValueError`
otherwise. They satisfy `dsh.projection.unit.Schema` without pydantic, so a runtime that lists
children loads no validation library (docs/architecture.md#import-cost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["IDENTITY_STATE", "IDENTITY_VIEW", "TIMING_STATE", "TIMING_VIEW"]

_Check = Callable[[object, str], Any]


def _object(value: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    unknown = [key for key in value if key not in required and key not in optional]
    if unknown:
        raise ValueError(f"{where}: unexpected key {unknown[0]!r}")
    missing = [key for key in required if key not in value]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")
    return value


def _int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}: expected an integer, got {type(value).__name__}")
    return value


def _count(value: object, where: str) -> int:
    number = _int(value, where)
    if number < 0:
        raise ValueError(f"{where}: expected an integer >= 0, got {number}")
    return number


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected a boolean, got {type(value).__name__}")
    return value


def _fields(value: dict[str, Any], where: str, checks: tuple[tuple[str, _Check], ...]) -> dict[str, Any]:
    """The checked fields present in `value`, in the order of `checks`."""
    return {key: check(value[key], f"{where}.{key}") for key, check in checks if key in value}


def _identity(value: object, where: str) -> dict[str, Any]:
    mode = value.get("mode") if isinstance(value, dict) else None
    if mode == "one-shot":
        found = _object(value, where, ("mode", "seq"), ("label",))
    elif mode == "continuable":
        found = _object(value, where, ("mode", "label", "seq"))
    else:
        raise ValueError(f'{where}: expected an identity with mode "one-shot" or "continuable"')
    return _fields(found, where, (("mode", _str), ("label", _str), ("seq", _count)))


def _interval(value: object, where: str) -> dict[str, Any]:
    found = _object(value, where, ("since", "through"))
    return _fields(found, where, (("since", _int), ("through", _int)))


class _Shape:
    """A `Schema`: `validate_python(value)` returns the checked copy or raises `ValueError`."""

    __slots__ = ("_check", "_name")

    def __init__(self, name: str, check: _Check) -> None:
        self._name = name
        self._check = check

    def validate_python(self, value: object, /) -> Any:
        """The checked copy of `value` (a new `dict`, keys in declaration order), or raise `ValueError`."""
        return self._check(value, self._name)

    def __repr__(self) -> str:
        return f"<schema {self._name}>"


def _identity_state(value: object, where: str) -> dict[str, Any]:
    return _fields(_object(value, where, (), ("identity",)), where, (("identity", _identity),))


def _identity_view(value: object, where: str) -> dict[str, Any] | None:
    return None if value is None else _identity(value, where)


def _timing_state(value: object, where: str) -> dict[str, Any]:
    found = _object(value, where, ("settledMs", "descriptorSeen"), ("active", "pendingTurnStart"))
    checks = (("settledMs", _count), ("descriptorSeen", _bool), ("active", _interval), ("pendingTurnStart", _int))
    return _fields(found, where, checks)


def _timing_view(value: object, where: str) -> dict[str, Any]:
    found = _object(value, where, ("settledMs",), ("active",))
    return _fields(found, where, (("settledMs", _count), ("active", _interval)))


IDENTITY_STATE: Final = _Shape("subagent state", _identity_state)
"""`{}` or `{"identity": {mode: "one-shot", label?, seq} | {mode: "continuable", label, seq}}`."""
IDENTITY_VIEW: Final = _Shape("subagent view", _identity_view)
"""The identity itself, or `None`."""
TIMING_STATE: Final = _Shape("subagentTiming state", _timing_state)
"""`{settledMs, descriptorSeen, active?: {since, through}, pendingTurnStart?}`."""
TIMING_VIEW: Final = _Shape("subagentTiming view", _timing_view)
"""`{settledMs, active?: {since, through}}`."""
