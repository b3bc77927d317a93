"""The session header: the logical form every layer sees and the stored (disk) form.

Layer: session. The logical `SessionHeader` exposes `is_seeded` and never the integer fork cut; the
exact cut (`inherited_event_count`) travels beside it (on the `Session`, on observations and in the
projection-cache identity). Only the stored record keeps the integer, as `seedLength`, so logs stay
interchangeable with the TypeScript harness. All nine fields form the lifecycle witness: two headers
are the same lifecycle iff they are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, NewType, Self

import orjson

from dsh.json import FrozenDict, JsonValue, is_json, is_safe_int
from dsh.session.errors import SessionError

__all__ = [
    "SESSION_FORMAT_VERSION",
    "HeaderInit",
    "StoredHeaderError",
    "SessionHeader",
    "SessionId",
    "SessionLogOffset",
    "SessionSeq",
    "header_problem",
]

SESSION_FORMAT_VERSION: Final = 0

SessionId = NewType("SessionId", str)
SessionSeq = NewType("SessionSeq", int)
SessionLogOffset = NewType("SessionLogOffset", int)

Origin = Literal["subagent"]

_RETIRED_KEYS: Final = ("sandboxMode", "approvalPolicy")


class StoredHeaderError(ValueError):
    """A stored header record failed validation; `version_problem` marks a version refusal."""

    def __init__(self, message: str, *, found_version: object = None, version_problem: bool = False) -> None:
        super().__init__(message)
        self.found_version = found_version
        self.version_problem = version_problem


def _repr(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _nonneg_safe(value: object) -> bool:
    return is_safe_int(value) and value >= 0  # type: ignore[operator]


def _is_absolute_posix(value: str) -> bool:
    return value.startswith("/")


def header_problem(
    *,
    version: object,
    session_id: object,
    created_at: object,
    cwd: object,
    parent_session: object,
    delegation_depth: object,
    origin: object,
    agent_preset: object,
    expected_id: str | None = None,
) -> str | None:
    """The first header rule `values` break, in the upstream order and wording; None when valid."""
    if not (is_safe_int(version) and version == SESSION_FORMAT_VERSION):
        return f"session header version must be {SESSION_FORMAT_VERSION}, got {_repr(version)}"
    if type(session_id) is not str or not session_id:
        return "session header id must be a non-empty string"
    if expected_id is not None and session_id != expected_id:
        return f'session header id "{session_id}" does not match session id "{expected_id}"'
    if not _nonneg_safe(created_at):
        return "session header createdAt must be a non-negative safe integer"
    if cwd is not None and not (type(cwd) is str and cwd and _is_absolute_posix(cwd)):
        return f"session header cwd must be an absolute path, got {_repr(cwd)}"
    if parent_session is not None and not (type(parent_session) is str and parent_session):
        return "session header parentSession must be a string"
    if origin is not None and origin != "subagent":
        return 'session header origin must be "subagent"'
    if not _nonneg_safe(delegation_depth):
        return "session header delegationDepth must be a non-negative safe integer"
    if agent_preset is not None and type(agent_preset) is not str:
        return "session header agentPreset must be a string"
    # Header strings cross the JSON boundary too: a lone surrogate could never be written to disk.
    for wire, value in (("cwd", cwd), ("parentSession", parent_session), ("agentPreset", agent_preset)):
        if value is not None and not is_json(value):
            return f"session header {wire} must be valid Unicode (it holds a lone surrogate)"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeader:
    """The logical session header; equality is lifecycle-witness equality (all nine fields)."""

    version: int
    id: SessionId
    created_at: int
    cwd: str | None = None
    parent_session: SessionId | None = None
    is_seeded: bool = False
    delegation_depth: int = 0
    origin: Origin | None = None
    agent_preset: str | None = None

    def to_json(self) -> FrozenDict:
        """Wire form: `isSeeded` and `delegationDepth` always present, other absent keys omitted."""
        out: dict[str, JsonValue] = {"version": self.version, "id": self.id, "createdAt": self.created_at}
        if self.cwd is not None:
            out["cwd"] = self.cwd
        if self.parent_session is not None:
            out["parentSession"] = self.parent_session
        out["isSeeded"] = self.is_seeded
        out["delegationDepth"] = self.delegation_depth
        if self.origin is not None:
            out["origin"] = self.origin
        if self.agent_preset is not None:
            out["agentPreset"] = self.agent_preset
        return FrozenDict(out)

    def to_stored(self, inherited_event_count: int) -> FrozenDict:
        """The upstream JSONL header record; `seedLength` only when the cut is above zero."""
        if not _nonneg_safe(inherited_event_count):
            raise ValueError("inherited_event_count must be a non-negative safe integer")
        if (inherited_event_count > 0) != self.is_seeded:
            raise ValueError(f"inherited_event_count {inherited_event_count} contradicts is_seeded={self.is_seeded}")
        out: dict[str, JsonValue] = {
            "type": "session",
            "version": self.version,
            "id": self.id,
            "createdAt": self.created_at,
        }
        if self.cwd is not None:
            out["cwd"] = self.cwd
        if self.parent_session is not None:
            out["parentSession"] = self.parent_session
        if inherited_event_count > 0:
            out["seedLength"] = inherited_event_count
        if self.origin is not None:
            out["origin"] = self.origin
        out["delegationDepth"] = self.delegation_depth
        if self.agent_preset is not None:
            out["agentPreset"] = self.agent_preset
        return FrozenDict(out)

    @classmethod
    def from_stored(cls, record: Mapping[str, object]) -> tuple[Self, int]:
        """Parse a stored header record into `(header, inherited_event_count)`.

        `version` is checked first: another number is a format refusal (`StoredHeaderError` with
        `version_problem=True`), never corruption. Unknown keys are ignored; the retired policy
        keys are refused; a missing `delegationDepth` reads as 0.

        Raises:
            StoredHeaderError: The record is not a valid stored header.
        """
        version = record.get("version")
        if not (is_safe_int(version) and version == SESSION_FORMAT_VERSION):
            raise StoredHeaderError(
                f"session header version must be {SESSION_FORMAT_VERSION}, got {_repr(version)}",
                found_version=version,
                version_problem=type(version) in (int, float) and type(version) is not bool,
            )
        if record.get("type") != "session":
            raise StoredHeaderError('session header type must be "session"')
        for key in _RETIRED_KEYS:
            if key in record:
                raise StoredHeaderError("session header uses retired policy baseline fields")
        seed_length = record.get("seedLength", 0)
        if not _nonneg_safe(seed_length):
            raise StoredHeaderError("session header seedLength must be a non-negative safe integer")
        depth = record.get("delegationDepth", 0)
        problem = header_problem(
            version=version,
            session_id=record.get("id"),
            created_at=record.get("createdAt"),
            cwd=record.get("cwd"),
            parent_session=record.get("parentSession"),
            delegation_depth=depth,
            origin=record.get("origin"),
            agent_preset=record.get("agentPreset"),
        )
        if problem is not None:
            raise StoredHeaderError(problem)
        cut: int = seed_length  # type: ignore[assignment]
        header = cls(
            version=SESSION_FORMAT_VERSION,
            id=SessionId(record["id"]),  # type: ignore[arg-type]
            created_at=record["createdAt"],  # type: ignore[arg-type]
            cwd=record.get("cwd"),  # type: ignore[arg-type]
            parent_session=record.get("parentSession"),  # type: ignore[arg-type]
            is_seeded=cut > 0,
            delegation_depth=depth,  # type: ignore[arg-type]
            origin=record.get("origin"),  # type: ignore[arg-type]
            agent_preset=record.get("agentPreset"),  # type: ignore[arg-type]
        )
        return header, cut

    def witness_difference(self, other: SessionHeader) -> str | None:
        """Name the first lifecycle-witness field (JSON name) on which `other` differs, or None."""
        for name, wire in _WITNESS_FIELDS:
            if getattr(self, name) != getattr(other, name):
                return wire
        return None


_WITNESS_FIELDS: Final = (
    ("version", "version"),
    ("id", "id"),
    ("created_at", "createdAt"),
    ("cwd", "cwd"),
    ("parent_session", "parentSession"),
    ("is_seeded", "isSeeded"),
    ("delegation_depth", "delegationDepth"),
    ("origin", "origin"),
    ("agent_preset", "agentPreset"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderInit:
    """Caller-supplied header fields for a new session; every field is optional (keywords only)."""

    created_at: int | None = None
    cwd: str | None = None
    parent_session: str | None = None
    delegation_depth: int = 0
    origin: Origin | None = None
    agent_preset: str | None = None

    def build(self, session_id: str, *, created_at: int, is_seeded: bool) -> SessionHeader:
        """Validate and build the logical header; raises `INVALID_HEADER`."""
        stamp = created_at if self.created_at is None else self.created_at
        problem = header_problem(
            version=SESSION_FORMAT_VERSION,
            session_id=session_id,
            created_at=stamp,
            cwd=self.cwd,
            parent_session=self.parent_session,
            delegation_depth=self.delegation_depth,
            origin=self.origin,
            agent_preset=self.agent_preset,
        )
        if problem is not None:
            raise SessionError(problem, code="INVALID_HEADER", session_id=session_id)
        return SessionHeader(
            version=SESSION_FORMAT_VERSION,
            id=SessionId(session_id),
            created_at=stamp,
            cwd=self.cwd,
            parent_session=SessionId(self.parent_session) if self.parent_session is not None else None,
            is_seeded=is_seeded,
            delegation_depth=self.delegation_depth,
            origin=self.origin,
            agent_preset=self.agent_preset,
        )


# Shown under the name users import (docs/architecture.md#public-names).
HeaderInit.__module__ = "dsh"
SessionHeader.__module__ = "dsh"
