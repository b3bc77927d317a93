"""Catalog rows: what `list_children` and `list_descendants` return, and their JSON form.

Layer: subagent. A child row carries mode, label, activity and `has_children`; a diagnostic row says
only that a child exists and why its identity cannot be shown (`corrupt`, `unavailable`;
`unsupported` stays in the vocabulary but is never produced). JSON names are the upstream camelCase
ones so wire frames stay interchangeable with the TypeScript harness. The records validate
themselves on construction and `from_json` is strict (unknown keys, kinds, modes and reasons are
refused), so a row that reaches a consumer always keeps the mode/label contract: a continuable child
has a label, and a diagnostic row never carries descriptor content. Rows are frozen dataclasses:
immutable (assigning a field raises `dataclasses.FrozenInstanceError`), compared and hashed by
value; `dataclasses.replace` checks the changed row again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, cast

from dsh.session.header import SessionId

__all__ = [
    "Activity",
    "DiagnosticReason",
    "Mode",
    "SubagentChildRow",
    "SubagentDescendantEntry",
    "SubagentDiagnosticRow",
    "SubagentListEntry",
    "entry_from_json",
]

Mode = Literal["one-shot", "continuable"]
Activity = Literal["running", "inactive"]
DiagnosticReason = Literal["corrupt", "unsupported", "unavailable"]

_MODES: Final = ("one-shot", "continuable")
_ACTIVITIES: Final = ("running", "inactive")
_REASONS: Final = ("corrupt", "unsupported", "unavailable")

_CHILD_KEYS: Final = ("kind", "id", "mode", "label", "activity", "hasChildren")
_DIAGNOSTIC_KEYS: Final = ("kind", "id", "reason")
_DESCENDANT_KEYS: Final = ("parentId", "depth")


def _check_id(value: object, what: str) -> None:
    if type(value) is not str or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")


def _object(data: object, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be an object, got {type(data).__name__}")
    return data


def _refuse_unknown(data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    # Closed schema: the first unknown key (insertion order) is named, so the error is deterministic.
    for key in data:
        if key not in allowed:
            raise ValueError(f'subagent row has unknown field "{key}"')


@dataclass(frozen=True, slots=True)
class SubagentChildRow:
    """A child whose identity was computed: mode, label (required when continuable), activity.

    Raises:
        ValueError: On construction, for an empty id, an unknown mode or activity, a non-bool
            `has_children`, a label that is not a string, or a continuable row without a label.
    """

    id: SessionId
    mode: Mode
    activity: Activity
    has_children: bool
    label: str | None = None
    kind: Literal["child"] = "child"

    def __post_init__(self) -> None:
        _check_id(self.id, "subagent row id")
        if self.kind != "child":
            raise ValueError(f"a child row has kind 'child', got {self.kind!r}")
        if self.mode not in _MODES:
            raise ValueError(f"unknown subagent mode {self.mode!r}")
        if self.activity not in _ACTIVITIES:
            raise ValueError(f"unknown subagent activity {self.activity!r}")
        if type(self.has_children) is not bool:
            raise ValueError(f"subagent row has_children must be a bool, got {self.has_children!r}")
        if self.label is not None and type(self.label) is not str:
            raise ValueError(f"subagent row label must be a string, got {self.label!r}")
        if self.mode == "continuable" and self.label is None:
            raise ValueError("a continuable child row requires a label")

    def to_json(self) -> dict[str, object]:
        """`{kind, id, mode, label?, activity, hasChildren}` in that order; `label` left out when None."""
        out: dict[str, object] = {"kind": "child", "id": self.id, "mode": self.mode}
        if self.label is not None:
            out["label"] = self.label
        out["activity"] = self.activity
        out["hasChildren"] = self.has_children
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SubagentChildRow:
        """Parse the wire form of a child row (strict: closed keys, known values, label rules).

        Raises:
            ValueError: The object is not a valid child row.
        """
        data = _object(data, "a subagent child row")
        _refuse_unknown(data, _CHILD_KEYS)
        if data.get("kind") != "child":
            raise ValueError(f"a child row has kind 'child', got {data.get('kind')!r}")
        row_id, mode, activity = data.get("id"), data.get("mode"), data.get("activity")
        _check_id(row_id, "subagent row id")
        if mode not in _MODES:
            raise ValueError(f"unknown subagent mode {mode!r}")
        if activity not in _ACTIVITIES:
            raise ValueError(f"unknown subagent activity {activity!r}")
        has_children = data.get("hasChildren")
        if type(has_children) is not bool:
            raise ValueError(f"subagent row hasChildren must be a boolean, got {has_children!r}")
        # `label` is left out when absent, never written as null: a present label must be a string.
        label = data.get("label")
        if "label" in data and type(label) is not str:
            raise ValueError(f"subagent row label must be a string, got {label!r}")
        return cls(SessionId(cast(str, row_id)), cast(Mode, mode), cast(Activity, activity), has_children, label=label)


@dataclass(frozen=True, slots=True)
class SubagentDiagnosticRow:
    """A child that exists but whose identity cannot be shown; never exposes descriptor content.

    Raises:
        ValueError: On construction, for an empty id or an unknown reason.
    """

    id: SessionId
    reason: DiagnosticReason
    kind: Literal["diagnostic"] = "diagnostic"

    def __post_init__(self) -> None:
        _check_id(self.id, "subagent row id")
        if self.kind != "diagnostic":
            raise ValueError(f"a diagnostic row has kind 'diagnostic', got {self.kind!r}")
        if self.reason not in _REASONS:
            raise ValueError(f"unknown diagnostic reason {self.reason!r}")

    def to_json(self) -> dict[str, object]:
        """`{kind, id, reason}`."""
        return {"kind": "diagnostic", "id": self.id, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SubagentDiagnosticRow:
        """Parse the wire form of a diagnostic row; `unsupported` is accepted (never produced).

        Raises:
            ValueError: The object is not a valid diagnostic row.
        """
        data = _object(data, "a subagent diagnostic row")
        _refuse_unknown(data, _DIAGNOSTIC_KEYS)
        if data.get("kind") != "diagnostic":
            raise ValueError(f"a diagnostic row has kind 'diagnostic', got {data.get('kind')!r}")
        row_id, reason = data.get("id"), data.get("reason")
        _check_id(row_id, "subagent row id")
        if reason not in _REASONS:
            raise ValueError(f"unknown diagnostic reason {reason!r}")
        return cls(SessionId(cast(str, row_id)), cast(DiagnosticReason, reason))


SubagentListEntry: TypeAlias = SubagentChildRow | SubagentDiagnosticRow


def entry_from_json(data: Mapping[str, Any]) -> SubagentListEntry:
    """Parse a child or diagnostic row by its `kind`; rejects unknown keys, kinds, modes and reasons.

    A continuable child without a label is rejected; `unsupported` is accepted although the
    listing never produces it.

    Raises:
        ValueError: The object is not a valid row.
    """
    data = _object(data, "a subagent row")
    kind = data.get("kind")
    if kind == "child":
        return SubagentChildRow.from_json(data)
    if kind == "diagnostic":
        return SubagentDiagnosticRow.from_json(data)
    raise ValueError(f"unknown subagent row kind {kind!r}")


@dataclass(frozen=True, slots=True)
class SubagentDescendantEntry:
    """A row of `list_descendants`: the entry, its durable direct parent, and its depth (children = 1).

    Raises:
        ValueError: On construction, for an entry that is not a row, an empty `parent_id`, or a
            depth that is not an int >= 1.
    """

    entry: SubagentListEntry
    parent_id: SessionId
    depth: int

    def __post_init__(self) -> None:
        if not isinstance(self.entry, SubagentChildRow | SubagentDiagnosticRow):
            raise ValueError(f"a descendant entry wraps a subagent row, got {type(self.entry).__name__}")
        _check_id(self.parent_id, "descendant row parentId")
        if type(self.depth) is not int or self.depth < 1:
            raise ValueError(f"descendant row depth must be an integer >= 1, got {self.depth!r}")

    def to_json(self) -> dict[str, object]:
        """The entry's JSON plus `parentId` and `depth`, in that order."""
        out = self.entry.to_json()
        out["parentId"] = self.parent_id
        out["depth"] = self.depth
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SubagentDescendantEntry:
        """Parse the wire form; strict about keys and values like `entry_from_json`.

        Raises:
            ValueError: The object is not a valid descendant row.
        """
        data = _object(data, "a descendant row")
        for key in _DESCENDANT_KEYS:
            if key not in data:
                raise ValueError(f'descendant row is missing "{key}"')
        rest = {key: value for key, value in data.items() if key not in _DESCENDANT_KEYS}
        parent_id, depth = data["parentId"], data["depth"]
        _check_id(parent_id, "descendant row parentId")
        if type(depth) is not int or depth < 1:
            raise ValueError(f"descendant row depth must be an integer >= 1, got {depth!r}")
        return cls(entry_from_json(rest), SessionId(parent_id), depth)


# Shown under the name users import (docs/architecture.md#public-names).
SubagentChildRow.__module__ = "dsh"
SubagentDescendantEntry.__module__ = "dsh"
SubagentDiagnosticRow.__module__ = "dsh"
