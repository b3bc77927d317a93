"""Errors of the persistence layer (`dsh.persistence`).

All derive from `SessionPersistenceError` and carry `code`, `session_id` and `location` (a path or
other locator when one is known); the original exception travels as `__cause__`. The three read
verdicts are never confused: not-found (nothing stored), format-unsupported (an intact log this build
cannot interpret) and corruption (read successfully but invalid).
"""

from __future__ import annotations

from typing import Literal

from dsh.errors import DshError

__all__ = [
    "AppendConflictError",
    "LeaseHeldError",
    "LeaseLostError",
    "OperationCancelledError",
    "PersistenceClosedError",
    "PersistenceIOError",
    "SessionAlreadyExistsError",
    "SessionCorruptionError",
    "SessionFormatUnsupportedError",
    "SessionLiveError",
    "SessionNotFoundError",
    "SessionPersistenceError",
    "StoreFormatUnsupportedError",
    "StoreMisconfiguredError",
    "raw_log_suffix",
]


def raw_log_suffix(location: str | None) -> str:
    """The ` (raw log: <path>)` suffix user-facing refusals end with when a path is known."""
    return f" (raw log: {location})" if location else ""


class SessionPersistenceError(DshError):
    """Base of every persistence error.

    Attributes:
        session_id: The session concerned, when known.
        location: The artifact path (or another locator), when known.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        session_id: str | None = None,
        location: str | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.session_id = session_id
        self.location = location


class SessionNotFoundError(SessionPersistenceError):
    """Nothing is stored under the id."""

    codes = frozenset({"SESSION_NOT_FOUND"})


class SessionFormatUnsupportedError(SessionPersistenceError):
    """An intact log this build cannot interpret (never reported as corruption).

    Attributes:
        found_version: The stored header version, for a version refusal.
        direction: `"newer"` (upgrade to open it) or `"older"` (no upgrade path), for a version refusal.
        event_type: The refused event type, for a vocabulary refusal.
        seq: The seq (position) of the refused event.
    """

    codes = frozenset({"SESSION_FORMAT_UNSUPPORTED"})

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        location: str | None = None,
        found_version: object = None,
        direction: Literal["newer", "older"] | None = None,
        event_type: str | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id, location=location)
        self.found_version = found_version
        self.direction = direction
        self.event_type = event_type
        self.seq = seq


class SessionCorruptionError(SessionPersistenceError):
    """Content was read but failed validation (including any defect inside a complete zstd frame)."""

    codes = frozenset({"SESSION_CORRUPT"})


class SessionAlreadyExistsError(SessionPersistenceError):
    """A new session's id is already stored or owned by a preparation."""

    codes = frozenset({"SESSION_ALREADY_EXISTS"})


class SessionLiveError(SessionPersistenceError):
    """A stored session cannot be prepared while it is live in this process."""

    codes = frozenset({"SESSION_LIVE"})


class AppendConflictError(SessionPersistenceError):
    """A batch does not start at the stored next seq (a stale writer)."""

    codes = frozenset({"APPEND_SEQ_MISMATCH"})


class LeaseHeldError(SessionPersistenceError):
    """Another process or host is the session's writer.

    Attributes:
        holder: Who holds the writer lock or lease (`<pid>@<host>` or a coordinator id).
        expires_at: When a lease expires (PostgreSQL), else None.
    """

    codes = frozenset({"SESSION_LEASE_HELD"})

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        location: str | None = None,
        holder: str | None = None,
        expires_at: object = None,
    ) -> None:
        super().__init__(message, session_id=session_id, location=location)
        self.holder = holder
        self.expires_at = expires_at


class LeaseLostError(SessionPersistenceError):
    """This host was fenced out of a session it was writing (PostgreSQL)."""

    codes = frozenset({"SESSION_LEASE_LOST"})


class StoreFormatUnsupportedError(SessionPersistenceError):
    """The store's schema is newer, older without migration, or belongs to another application."""

    codes = frozenset({"STORE_FORMAT_UNSUPPORTED"})


class StoreMisconfiguredError(SessionPersistenceError):
    """The store location is unusable as configured (root is a file, wrong encoding, unsafe path)."""

    codes = frozenset({"STORE_MISCONFIGURED"})


class PersistenceIOError(SessionPersistenceError):
    """An OS or driver operation failed (including a failed append rollback)."""

    codes = frozenset({"PERSISTENCE_IO"})


class PersistenceClosedError(SessionPersistenceError):
    """Any call after `close()`."""

    codes = frozenset({"PERSISTENCE_CLOSED"})


class OperationCancelledError(SessionPersistenceError):
    """The caller's signal aborted; `reason` is the signal's reason."""

    codes = frozenset({"OPERATION_CANCELLED"})

    def __init__(self, message: str, *, reason: object = None, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.reason = reason


# Shown under the name users import (docs/architecture.md#public-names).
SessionPersistenceError.__module__ = "dsh"
