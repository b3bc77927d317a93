"""Errors of the session layer (`dsh.session`).

`SessionError` covers header, seed and append validation and the store's lifecycle refusals;
`SessionForkError` adds the fork-only codes. Every instance carries the session id it concerns.
"""

from __future__ import annotations

from dsh.errors import DshError

__all__ = ["SessionError", "SessionForkError"]


class SessionError(DshError):
    """A session, its header, seed or an append was refused.

    Attributes:
        session_id: The id the failure concerns, when known.
    """

    codes = frozenset(
        {
            "INVALID_HEADER",
            "INVALID_SEED",
            "INVALID_EVENT",
            "APPEND_REENTRANT",
            "SESSION_ALREADY_EXISTS",
            "SESSION_NOT_LIVE",
            "SESSION_RETIRED",
            "SESSION_STORE_CLOSED",
        }
    )

    def __init__(self, message: str, *, code: str, session_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.session_id = session_id


class SessionForkError(SessionError):
    """A fork was refused; a failed fork publishes nothing."""

    codes = SessionError.codes | frozenset({"SESSION_NOT_FOUND", "INVALID_BOUNDARY", "OPEN_TURN"})


# Shown under the name users import (docs/architecture.md#public-names).
SessionError.__module__ = "dsh"
SessionForkError.__module__ = "dsh"
