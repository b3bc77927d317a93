"""Errors of the session query layer (`dsh.query`).

Layer: query. One class, `SessionQueryError`, carries every failure of `SessionQuery` with a code
from a closed set. Routing is on `.code`, never on the message. Constructor problems (a missing
session store, a bad `QueryConfig`) are `ConfigError` (`CONFIG_INVALID`), not query codes.

The search codes `SESSION_QUERY_SEARCH_DISABLED`, `SESSION_QUERY_INVALID_QUERY`,
`SESSION_QUERY_INVALID_CURSOR`, `SESSION_QUERY_STALE_CURSOR` and `SESSION_QUERY_INDEX_FAILED` are
reserved for a future search provider. They are deliberately *not* codes this class can carry:
nothing raises them, so the error catalog does not list them. `SESSION_QUERY_INVALID_FILTER` is a
real code: `filter_sessions` raises it for a malformed `SessionFilter`.
`SESSION_QUERY_PROJECTIONS_UNAVAILABLE` does not exist: there is no query-side value index that could
need projections.
"""

from __future__ import annotations

from typing import Final

from dsh.errors import DshError

__all__ = [
    "ABORTED",
    "CORRUPT_SESSION",
    "INVALID_FILTER",
    "INVALID_LIMIT",
    "INVALID_LINEAGE",
    "INVALID_WINDOW",
    "PERSISTENCE_FAILED",
    "SESSION_NOT_FOUND",
    "SOURCE_CONFLICT",
    "UNSUPPORTED_FORMAT",
    "SessionQueryError",
]

ABORTED: Final = "SESSION_QUERY_ABORTED"
"""The caller's signal aborted before the operation completed."""
SESSION_NOT_FOUND: Final = "SESSION_QUERY_SESSION_NOT_FOUND"
"""The id is neither live nor persisted."""
CORRUPT_SESSION: Final = "SESSION_QUERY_CORRUPT_SESSION"
"""The stored log failed validation, or its inherited cut is inconsistent."""
UNSUPPORTED_FORMAT: Final = "SESSION_QUERY_UNSUPPORTED_FORMAT"
"""An intact stored log uses a format this build cannot read."""
PERSISTENCE_FAILED: Final = "SESSION_QUERY_PERSISTENCE_FAILED"
"""The persistence listing or an inspection failed for another reason."""
SOURCE_CONFLICT: Final = "SESSION_QUERY_SOURCE_CONFLICT"
"""Sources disagree about one id's lifecycle."""
INVALID_WINDOW: Final = "SESSION_QUERY_INVALID_WINDOW"
"""A history `before_seq` is not a non-negative integer."""
INVALID_LIMIT: Final = "SESSION_QUERY_INVALID_LIMIT"
"""A history `max_messages` is not an integer in range."""
INVALID_LINEAGE: Final = "SESSION_QUERY_INVALID_LINEAGE"
"""The `parentSession` links contain a cycle."""
INVALID_FILTER: Final = "SESSION_QUERY_INVALID_FILTER"
"""A `filter_sessions` filter is malformed (not a `SessionFilter`, or a field of the wrong shape)."""


class SessionQueryError(DshError):
    """A session query failed; `code` is one of the ten `SESSION_QUERY_*` codes.

    The underlying exception, when there is one (a backend failure, a persistence refusal), is
    kept as `__cause__`.

    Args:
        message: Human-readable text (stable for each code).
        code: The failure kind.
        session_id: The session the failure concerns, when there is one.
        reason: For `SESSION_QUERY_ABORTED`, the reason the caller's signal was aborted with.

    Attributes:
        session_id: The session the failure concerns, or None (listing failures).
        reason: The abort reason (`SESSION_QUERY_ABORTED` only), else None.
    """

    codes = frozenset(
        {
            ABORTED,
            SESSION_NOT_FOUND,
            CORRUPT_SESSION,
            UNSUPPORTED_FORMAT,
            PERSISTENCE_FAILED,
            SOURCE_CONFLICT,
            INVALID_WINDOW,
            INVALID_LIMIT,
            INVALID_LINEAGE,
            INVALID_FILTER,
        }
    )

    def __init__(self, message: str, *, code: str, session_id: str | None = None, reason: object = None) -> None:
        super().__init__(message, code=code)
        self.session_id = session_id
        self.reason = reason


# Shown under the name users import (docs/architecture.md#public-names).
SessionQueryError.__module__ = "dsh"
